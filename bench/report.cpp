// The shared parts of `strata bench` reports (report.hpp).
#include "strata/bench/report.hpp"

#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "strata/core/clock.hpp"
#include "strata/core/error.hpp"
#include "strata/core/output_file.hpp"
#include "strata/core/safe_io.hpp"
#include "strata/memory/topology.hpp"

#ifndef STRATA_BENCH_PLOT_SCRIPT
#define STRATA_BENCH_PLOT_SCRIPT "bench/plot.py"
#endif

namespace strata::bench {

namespace {

using nlohmann::json;

// The directory a file would be created in must exist and be writable.
void check_writable(const std::string& flag, const std::string& path) {
  if (path.empty()) throw ConfigError(flag + " needs a file name");
  if (std::filesystem::is_directory(path))
    throw ConfigError(flag + " '" + path + "' is a directory; give a file name");
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = ".";
  if (!std::filesystem::is_directory(dir))
    throw ConfigError(flag + " '" + path + "': directory '" + dir.string() + "' does not exist");
  if (access(dir.c_str(), W_OK) != 0)
    throw ConfigError(flag + " '" + path + "': cannot write in '" + dir.string() + "': " + std::strerror(errno));
  check_output_path(path, flag);  // a regular file or a new name, outside checkpoints
}

std::string cell_text(const json& v, const std::string& format) {
  if (v.is_null()) return "-";
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number() && !format.empty()) {
    char buf[64];
    std::snprintf(buf, sizeof buf, format.c_str(), v.get<double>());
    return buf;
  }
  return v.dump();
}

std::string csv_field(const json& v) {
  if (v.is_null()) return "";
  std::string s = v.is_string() ? v.get<std::string>() : v.dump();
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

void print_table(std::FILE* out, const Table& t) {
  std::vector<size_t> width(t.columns.size());
  std::vector<bool> left(t.columns.size(), false);
  std::vector<std::vector<std::string>> cells;
  for (size_t c = 0; c < t.columns.size(); ++c) width[c] = t.columns[c].header.size();
  for (const json& row : t.rows) {
    std::vector<std::string> line;
    for (size_t c = 0; c < t.columns.size(); ++c) {
      const json v = row.contains(t.columns[c].key) ? row.at(t.columns[c].key) : json();
      if (v.is_string()) left[c] = true;
      line.push_back(cell_text(v, t.columns[c].format));
      width[c] = std::max(width[c], line.back().size());
    }
    cells.push_back(std::move(line));
  }
  auto put = [&](size_t c, const std::string& s) {
    std::fprintf(out, c == 0 ? "" : "  ");
    if (left[c]) std::fprintf(out, "%-*s", static_cast<int>(width[c]), s.c_str());
    else std::fprintf(out, "%*s", static_cast<int>(width[c]), s.c_str());
  };
  for (size_t c = 0; c < t.columns.size(); ++c) put(c, t.columns[c].header);
  std::fprintf(out, "\n");
  for (const auto& line : cells) {
    for (size_t c = 0; c < line.size(); ++c) put(c, line[c]);
    std::fprintf(out, "\n");
  }
}

void write_text(const std::string& flag, const std::string& path, const std::string& text) {
  if (path == "-") {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
    return;
  }
  check_output_path(path, flag);
  // Whole or not at all: a full disk leaves an earlier report as it was, not a cut one.
  write_file_replacing(path, text, "the report (" + flag + ")",
                       "free space on it or give " + flag + " a path on a disk with room");
}

}  // namespace

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::vector<size_t> find_labels(const std::vector<std::string>& names, const std::vector<std::string>& asked,
                                const std::string& flag) {
  std::vector<size_t> found;
  for (const std::string& l : asked) {
    const auto it = std::find(names.begin(), names.end(), l);
    if (it == names.end()) {
      std::string all;
      for (const std::string& n : names) all += (all.empty() ? "'" : ", '") + n + "'";
      throw ConfigError(flag + " '" + l + "' is no configuration of this run; give one of " + all);
    }
    found.push_back(static_cast<size_t>(it - names.begin()));
  }
  return found;
}

// Runs a shell command; returns its exit status, with stdout and stderr in *output.
int run_command(const std::string& cmd, std::string* output) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return -1;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0)
    if (output) output->append(buf, n);
  const int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

std::string short_size(uint64_t b) {
  if (b >= (1ull << 40) && b % (1ull << 40) == 0) return std::to_string(b >> 40) + "T";
  if (b >= (1ull << 30) && b % (1ull << 30) == 0) return std::to_string(b >> 30) + "G";
  if (b >= (1ull << 20) && b % (1ull << 20) == 0) return std::to_string(b >> 20) + "M";
  if (b >= (1ull << 10) && b % (1ull << 10) == 0) return std::to_string(b >> 10) + "K";
  return std::to_string(b);
}

std::string command_line(const CLI::App& sub, const std::string& prefix) {
  std::string cmd = prefix;
  for (const auto* opt : sub.get_options()) {
    if (opt->count() == 0 || opt->get_name().empty() || opt->get_name() == "--help") continue;
    cmd += " " + opt->get_name();
    if (opt->get_type_size() != 0)
      for (const auto& v : opt->results()) cmd += " " + v;
  }
  return cmd;
}

double load_average() {
  double load = -1;
  if (std::FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &load) != 1) load = -1;
    std::fclose(f);
  }
  return load;
}

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

Summary summarize(const std::vector<double>& samples) {
  Summary s;
  if (samples.empty()) return s;
  std::vector<double> v = samples;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  s.median = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  s.min = v.front();
  s.max = v.back();
  return s;
}

json to_json(const Summary& s, const std::vector<double>& samples) {
  return json{{"median", s.median}, {"min", s.min}, {"max", s.max}, {"spread", s.spread()}, {"runs", samples}};
}

Progress::Progress(std::string prefix) : prefix_(std::move(prefix)), tty_(isatty(2) != 0) {}
Progress::~Progress() { done(); }

void Progress::show(const std::string& what) {
  if (tty_) {
    std::fprintf(stderr, "\r%s: %s\033[K", prefix_.c_str(), what.c_str());
    std::fflush(stderr);
    shown_ = true;
    return;
  }
  const double now = steady_seconds();
  if (now - last_ < 10.0) return;
  last_ = now;
  std::fprintf(stderr, "%s: %s\n", prefix_.c_str(), what.c_str());
}

void Progress::done() {
  if (tty_ && shown_) std::fprintf(stderr, "\r\033[K");
  shown_ = false;
}

json machine_json() {
  const MachineSummary m = machine_summary();
  json disks = json::array(), gpus = json::array();
  for (const auto& d : m.disks)
    disks.push_back({{"name", d.name}, {"model", d.model}, {"bytes", d.bytes},
                     {"rotational", d.rotational < 0 ? json() : json(d.rotational == 1)}});
  for (const auto& g : m.gpu_list) gpus.push_back({{"name", g.name}, {"model", g.model}, {"memory_bytes", g.memory_bytes}});
  struct utsname u {};
  uname(&u);
  // hwloc counts the memory of NUMA nodes; some VMs have memory outside any node, which
  // the kernel's MemTotal includes. Both are reported when they differ.
  unsigned long long kernel_kib = 0;
  if (std::FILE* f = std::fopen("/proc/meminfo", "r")) {
    if (std::fscanf(f, "MemTotal: %llu kB", &kernel_kib) != 1) kernel_kib = 0;
    std::fclose(f);
  }
  return json{{"cpu_model", m.cpu_model.empty() ? "unknown" : m.cpu_model},
              {"cores", m.cores},
              {"threads", m.threads},
              {"numa_nodes", m.numa_nodes},
              {"memory_bytes", m.memory_bytes},
              {"memory_bytes_kernel", kernel_kib * 1024},
              {"disks", disks},
              {"gpus", gpus},
              {"kernel", std::string(u.sysname) + " " + u.release},
              {"load_average_1m", load_average()}};
}

void print_machine(std::FILE* out, const json& m) {
  const uint64_t hw_mem = m.at("memory_bytes").get<uint64_t>();
  const uint64_t os_mem = m.value("memory_bytes_kernel", uint64_t{0});
  std::string memory = format_bytes(hw_mem) + " memory";
  if (os_mem > 0 && (os_mem > hw_mem * 1.01 || os_mem < hw_mem * 0.99))
    memory = format_bytes(hw_mem) + " memory in NUMA nodes (kernel MemTotal " + format_bytes(os_mem) + ")";
  std::fprintf(out, "machine: %s; %d cores, %d threads; %s; %d NUMA node%s; %s\n",
               m.at("cpu_model").get<std::string>().c_str(), m.at("cores").get<int>(), m.at("threads").get<int>(),
               memory.c_str(), m.at("numa_nodes").get<int>(),
               m.at("numa_nodes").get<int>() == 1 ? "" : "s", m.at("kernel").get<std::string>().c_str());
  std::string disks;
  for (const auto& d : m.at("disks")) {
    if (!disks.empty()) disks += ", ";
    disks += d.at("name").get<std::string>();
    std::string what = d.at("model").get<std::string>();
    if (d.at("bytes").get<uint64_t>() > 0) what += (what.empty() ? "" : " ") + format_bytes(d.at("bytes").get<uint64_t>());
    if (!d.at("rotational").is_null()) what += d.at("rotational").get<bool>() ? ", rotational" : ", non-rotational";
    if (!what.empty()) disks += " (" + what + ")";
  }
  std::string gpus;
  for (const auto& g : m.at("gpus")) {
    if (!gpus.empty()) gpus += ", ";
    gpus += g.at("name").get<std::string>();
    std::string what = g.at("model").get<std::string>();
    if (g.at("memory_bytes").get<uint64_t>() > 0)
      what += (what.empty() ? "" : ", ") + format_bytes(g.at("memory_bytes").get<uint64_t>());
    if (!what.empty()) gpus += " (" + what + ")";
  }
  std::fprintf(out, "disks: %s; GPUs: %s; load average %.2f\n", disks.empty() ? "none seen" : disks.c_str(),
               gpus.empty() ? "none" : gpus.c_str(), m.at("load_average_1m").get<double>());
}

void add_output_options(CLI::App& sub, OutputOptions& o, const std::string& plot_what) {
  sub.add_option("--json", o.json, "Write the report as JSON to this file ('-': stdout, instead of the table)");
  sub.add_option("--csv", o.csv, "Write the table as CSV to this file ('-': stdout, instead of the table)");
  sub.add_option("--plot", o.plot, "Draw " + plot_what + " into this PNG file (bench/plot.py, matplotlib)");
  sub.add_option("--plot-python", o.python, "Python with matplotlib for --plot")->capture_default_str();
}

void check_output_options(const OutputOptions& o, const std::vector<RunPath>& inputs,
                          const std::vector<RunPath>& more_outputs) {
  if (o.json == "-" && o.csv == "-") throw ConfigError("--json - and --csv - both ask for stdout; send one to a file");
  std::vector<RunPath> outputs = {{o.json == "-" ? "" : o.json, "--json"}, {o.csv == "-" ? "" : o.csv, "--csv"},
                                  {o.plot, "--plot"}, standard_output()};
  outputs.insert(outputs.end(), more_outputs.begin(), more_outputs.end());
  std::vector<RunPath> read = inputs;
  if (!o.plot.empty()) {
    read.push_back({o.python, "--plot-python"});
    read.push_back({plot_script(), "the plot script"});
  }
  check_outputs_replace_no_input(read, outputs);
  if (!o.json.empty() && o.json != "-") check_writable("--json", o.json);
  if (!o.csv.empty() && o.csv != "-") check_writable("--csv", o.csv);
  if (o.plot.empty()) return;
  if (!o.plot.ends_with(".png")) throw ConfigError("--plot '" + o.plot + "': the plot is a PNG; give a name ending in .png");
  check_writable("--plot", o.plot);
  if (!std::filesystem::exists(plot_script()))
    throw ConfigError("--plot: the plot script " + plot_script() + " is missing (it is found in the source tree)");
  std::string out;
  if (run_command(shell_quote(o.python) + " -c 'import matplotlib'", &out) != 0)
    throw ConfigError("--plot needs Python with matplotlib, but '" + o.python + " -c \"import matplotlib\"' failed: " +
                      out.substr(0, out.find('\n')) + "; give one with --plot-python (Debian: apt-get install python3-matplotlib)");
}

std::string plot_script() { return STRATA_BENCH_PLOT_SCRIPT; }

json report_json(const Report& r, const json& machine) {
  json doc = r.extra.is_object() ? r.extra : json::object();
  doc["tool"] = "strata bench " + r.benchmark;
  doc["benchmark"] = r.benchmark;
  doc["command"] = r.command;
  doc["machine"] = machine;
  doc["config"] = r.config;
  json cols = json::array();
  for (const auto& c : r.table.columns) cols.push_back({{"key", c.key}, {"header", c.header}});
  doc["columns"] = cols;
  doc["rows"] = r.table.rows;
  doc["notes"] = r.notes;
  return doc;
}

std::string report_csv(const Report& r) {
  std::ostringstream s;
  for (size_t c = 0; c < r.table.columns.size(); ++c) s << (c ? "," : "") << r.table.columns[c].key;
  s << "\n";
  for (const json& row : r.table.rows) {
    for (size_t c = 0; c < r.table.columns.size(); ++c) {
      const auto& key = r.table.columns[c].key;
      s << (c ? "," : "") << csv_field(row.contains(key) ? row.at(key) : json());
    }
    s << "\n";
  }
  return s.str();
}

void emit(const Report& r, const OutputOptions& o) {
  const json machine = machine_json();
  const json doc = report_json(r, machine);
  if (o.json != "-" && o.csv != "-") {
    std::printf("%s\n", r.title.c_str());
    print_machine(stdout, machine);
    std::printf("\n");
    if (r.print_human) r.print_human(stdout);
    else print_table(stdout, r.table);
    for (const auto& n : r.notes) std::printf("%s\n", n.c_str());
    std::fflush(stdout);
  }
  if (!o.json.empty()) write_text("--json", o.json, doc.dump(2) + "\n");
  if (!o.csv.empty()) write_text("--csv", o.csv, report_csv(r));
  if (!o.plot.empty()) {
    char tmpl[] = "/tmp/strata-bench-plot-XXXXXX";
    const int fd = mkstemp(tmpl);
    if (fd < 0) throw Error(std::string("--plot: cannot create a temporary file: ") + std::strerror(errno));
    close(fd);
    write_text("--plot", tmpl, doc.dump() + "\n");
    const std::string cmd = shell_quote(o.python) + " " + shell_quote(plot_script()) + " " + shell_quote(tmpl) +
                            " --out " + shell_quote(o.plot);
    std::string log;
    const int rc = run_command(cmd, &log);
    unlink(tmpl);
    if (rc != 0) throw Error("--plot: the plot script failed (exit " + std::to_string(rc) + "): " + cmd + "\n" + log);
    std::fprintf(stderr, "strata bench %s: wrote %s\n", r.benchmark.c_str(), o.plot.c_str());
  }
}

}  // namespace strata::bench
