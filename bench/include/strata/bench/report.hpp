// What every `strata bench` sub-benchmark shares: parsing sizes, statistics over
// repetitions, a progress line, the machine summary, and the report in its four forms
// (human table, --json, --csv, --plot PNG).
//
// A sub-benchmark measures, then fills a Report: its settings (`config`), a Table of
// rows (one per measured point; the same rows become the CSV and the JSON's "rows"),
// optional extra JSON fields, and optionally its own human printer. emit() puts the
// machine summary at the head of the table and of the JSON, writes the files, and draws
// the plot with bench/plot.py (run by /usr/bin/python3, Debian's, which has matplotlib).
//
// Adding a sub-benchmark (e.g. `strata bench step`): add_output_options() on its
// subcommand, check_output_options() before measuring, a Progress while it runs, and
// emit() at the end; give bench/plot.py a plot_<benchmark>() (plot_step exists already:
// stacked compute / exposed-transfer bars, see its docstring for the row keys it reads).
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "strata/core/byte_count.hpp"
#include "strata/core/output_guard.hpp"

namespace strata::bench {

// ---------------------------------------------------------------------------------------
// Inputs

// Sizes given as flags ("64K", "1M", "2GB") are read by parse_byte_count
// (core/byte_count.hpp), as every flag and key that takes a byte count.
// 65536 -> "64K", 3<<30 -> "3G"; other values in bytes.
std::string short_size(uint64_t bytes);
// 'text' with single quotes escaped, for a /bin/sh command line.
std::string shell_quote(const std::string& s);
// Runs a shell command; returns its exit status (-1 when it did not exit normally), with
// its stdout and stderr together in *output when given.
int run_command(const std::string& cmd, std::string* output);
// The command line as the user gave it, rebuilt from a parsed subcommand.
std::string command_line(const CLI::App& sub, const std::string& prefix);
// The index in `names` of each name `asked` gives, in the order asked (a name asked twice,
// twice). Throws ConfigError "FLAG 'x' is no configuration of this run; give one of 'a',
// 'b'" for a name not among them.
std::vector<size_t> find_labels(const std::vector<std::string>& names, const std::vector<std::string>& asked,
                                const std::string& flag);

// ---------------------------------------------------------------------------------------
// Statistics over repetitions

struct Summary {
  double median = 0, min = 0, max = 0;
  // (max - min) / median; 0 for fewer than two samples.
  double spread() const { return median > 0 ? (max - min) / median : 0; }
};
Summary summarize(const std::vector<double>& samples);
// {"median":..,"min":..,"max":..,"spread":..,"runs":[..]}
nlohmann::json to_json(const Summary& s, const std::vector<double>& samples);

// ---------------------------------------------------------------------------------------
// Progress on stderr while a benchmark runs. On a terminal: one line rewritten in place.
// Otherwise (a log, a pipe): the first update, then at most one line every 10 s, so
// logs stay short. done() clears the terminal line.
class Progress {
 public:
  explicit Progress(std::string prefix);
  ~Progress();
  void show(const std::string& what);
  void done();

 private:
  std::string prefix_;
  bool tty_;
  bool shown_ = false;
  double last_ = -1e9;  // seconds, steady clock
};

// ---------------------------------------------------------------------------------------
// Machine summary (hwloc; memory/topology.hpp): CPU model, cores, memory, NUMA nodes,
// disks, GPUs, load average.
nlohmann::json machine_json();
// The 1-minute load average (/proc/loadavg), -1 when unknown: other work on the machine
// skews every number, so reports carry it.
double load_average();
void print_machine(std::FILE* out, const nlohmann::json& machine);
// CPU seconds this thread has run. Against wall time it says what share of a core a
// single-threaded reference got: on a loaded machine, less than all of one.
double thread_cpu_seconds();
// CPU seconds every thread of this process has run (io_uring's kernel workers included).
double process_cpu_seconds();

// ---------------------------------------------------------------------------------------
// The report

struct Column {
  std::string key;     // JSON key and CSV header, e.g. "strata_median_gbps"
  std::string header;  // human table header, e.g. "strata GB/s"
  std::string format;  // printf format for numbers in the human table, e.g. "%.2f";
                       // empty: the value as text (strings, integers)
};

struct Table {
  std::vector<Column> columns;
  std::vector<nlohmann::json> rows;  // objects keyed by Column::key; more keys may go to JSON only
};

struct Report {
  std::string benchmark;         // "io", "copy", "capacity", "optimizer", "collectives", "step"
  std::string command;           // as run
  std::string title;             // first line of the human report
  nlohmann::json config;         // settings of the run
  Table table;
  std::vector<std::string> notes;  // printed under the table; also in the JSON
  nlohmann::json extra = nlohmann::json::object();  // further top-level JSON fields
  // Replaces the generic table printer (the existing benchmarks keep their layouts).
  std::function<void(std::FILE*)> print_human;
};

struct OutputOptions {
  std::string json;   // file, or "-" for stdout
  std::string csv;    // file, or "-" for stdout
  std::string plot;   // PNG file
  std::string python = "/usr/bin/python3";  // with matplotlib, for --plot
};

// Adds --json, --csv, --plot and --plot-python to a sub-benchmark. `plot_what` says in
// the help what the plot shows.
void add_output_options(CLI::App& sub, OutputOptions& o, const std::string& plot_what);
// Checks the output options before anything is measured: writable destinations, at
// most one of them on stdout, a .png plot name, a Python with matplotlib for --plot, and
// no output (these, `more_outputs` such as --trace, or standard output redirected to a
// file) that is one of the benchmark's `inputs` (its Python, its scripts), the plot's,
// or another output (check_outputs_replace_no_input). Throws ConfigError naming the flag.
void check_output_options(const OutputOptions& o, const std::vector<RunPath>& inputs = {},
                          const std::vector<RunPath>& more_outputs = {});
// The whole report as JSON (what --json writes).
nlohmann::json report_json(const Report& r, const nlohmann::json& machine);
// CSV text of the table: a header of column keys, one line per row.
std::string report_csv(const Report& r);
// Prints the human report (machine summary first) to stdout unless --json or --csv
// took stdout, writes --json and --csv, and draws --plot. Throws on failure to write.
void emit(const Report& r, const OutputOptions& o);

// The plot script (bench/plot.py in the source tree).
std::string plot_script();

}  // namespace strata::bench
