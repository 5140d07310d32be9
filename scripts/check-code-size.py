#!/usr/bin/env python3
"""Code size limits: outside tests/, no source file over 800 lines and no function over 100.

Usage: python3 scripts/check-code-size.py [--list] [FILE...]
  Checks the tracked .cpp/.hpp/.h/.cu/.cuh files outside tests/ (git ls-files), or the
  FILEs given. Prints 'path:line: name: N lines' for each file over 800 lines and each
  function over 100 lines and exits 1 if there are any, 0 if none. --list prints every
  file and function with its size and exits 0.

A function's lines run from the first line of its definition (template header and
signature included) to its closing brace. The scanner blanks comments, string and char
literals and preprocessor lines (keeping only the first branch of an #if/#else), then
matches braces: a brace at namespace or class scope opens a function body when what
precedes it is a signature (a parameter list, then qualifiers, a trailing return type or
a constructor's initializer list). Lambdas and local classes count as part of the
function around them.
"""

import argparse
import os
import re
import subprocess
import sys

MAX_FILE_LINES = 800
MAX_FUNCTION_LINES = 100
EXTENSIONS = (".cpp", ".hpp", ".h", ".cu", ".cuh")
RAW_PREFIXES = ("R", "u8R", "uR", "UR", "LR")


def strip_code(text):
    """text with comments, literals and preprocessor lines blanked; newlines are kept."""
    out = []
    i, n = 0, len(text)
    token_start = -1  # start of the identifier or number the previous character ends, else -1
    at_line_start = True  # only whitespace since the last newline
    while i < n:
        c = text[i]
        if c == "\n":
            out.append(c)
            i += 1
            at_line_start = True
            token_start = -1
            continue
        if at_line_start and c == "#":
            # A directive, with its backslash continuations.
            j = i
            while j < n and text[j] != "\n":
                if text[j] == "\\" and j + 1 < n and text[j + 1] == "\n":
                    out.append(" \n")
                    j += 2
                    continue
                out.append(" ")
                j += 1
            i = j
            continue
        if c in " \t\r\f\v":
            out.append(c)
            i += 1
            token_start = -1
            continue
        at_line_start = False
        if c == "/" and text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
            continue
        if c == "/" and text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
            continue
        if c == '"':
            prefix = text[token_start:i] if token_start >= 0 else ""
            if prefix in RAW_PREFIXES:
                m = re.compile(r'"([^()\\\s]{0,16})\(').match(text, i)
                if m:
                    end = text.find(")" + m.group(1) + '"', m.end())
                    end = n if end < 0 else end + len(m.group(1)) + 2
                    out.append('"' + re.sub(r"[^\n]", " ", text[i + 1:end - 1]) + '"')
                    i = end
                    token_start = -1
                    continue
            i = skip_quoted(text, i, '"', out)
            token_start = -1
            continue
        if c == "'":
            if token_start >= 0 and text[token_start].isdigit():
                out.append(c)  # a digit separator: 1'000'000
                i += 1
                continue
            i = skip_quoted(text, i, "'", out)
            token_start = -1
            continue
        if c.isalnum() or c == "_":
            if token_start < 0:
                token_start = i
        elif not (c == "." and token_start >= 0 and text[token_start].isdigit()):
            token_start = -1
        out.append(c)
        i += 1
    return "".join(out)


def skip_quoted(text, i, quote, out):
    """Blanks the literal opened at text[i]; returns the index after it."""
    j, n = i + 1, len(text)
    while j < n and text[j] != quote and text[j] != "\n":
        j += 2 if text[j] == "\\" else 1
    j = min(j, n - 1)
    out.append(quote + re.sub(r"[^\n]", " ", text[i + 1:j]) + quote)
    return j + 1


def drop_else_branches(text, stripped):
    """Blanks the #else/#elif branches of every #if, so the braces seen are one build's."""
    lines = stripped.split("\n")
    src = text.split("\n")
    depth_skip = []  # per open #if: whether its current branch is dropped
    for k, line in enumerate(src):
        m = re.match(r"\s*#\s*(if|ifdef|ifndef|elif|else|endif)\b", line)
        if m:
            word = m.group(1)
            if word.startswith("if"):
                depth_skip.append(False)
            elif word in ("elif", "else") and depth_skip:
                depth_skip[-1] = True
            elif word == "endif" and depth_skip:
                depth_skip.pop()
            continue
        if any(depth_skip):
            lines[k] = ""
    return "\n".join(lines)


def top_level_split(head):
    """head with the inside of every bracketed group blanked: what is left is its top level."""
    out = []
    depth = 0
    for c in head:
        if c in "([{":
            out.append(c if depth == 0 else " ")
            depth += 1
        elif c in ")]}":
            depth = max(depth - 1, 0)
            out.append(c if depth == 0 else " ")
        else:
            out.append(c if depth == 0 else " ")
    return "".join(out)


def strip_access_specifiers(head):
    """head from its first line that is not blank or an access specifier ('public:')."""
    while True:
        m = re.match(r"\s*(public|private|protected)\s*:(?!:)", head)
        if not m:
            break
        head = head[m.end():]
    m = re.match(r"\s*\n", head)
    while m:
        head = head[m.end():]
        m = re.match(r"\s*\n", head)
    return head.lstrip(" \t")


def strip_template_prefix(head):
    """head without leading 'template <...>' clauses, attributes and access specifiers."""
    while True:
        head = head.lstrip()
        m = re.match(r"(public|private|protected)\s*:(?!:)", head)
        if m:
            head = head[m.end():]
            continue
        if head.startswith("[["):
            end = head.find("]]")
            if end < 0:
                return head
            head = head[end + 2:]
            continue
        m = re.match(r"[A-Z][A-Z0-9_]*\s*\(", head)
        if m:  # a macro that declares something, with no ';': STRATA_DEFINE_CALL_CHECK(...)
            end = skip_group(head, m.end() - 1)
            if head[end:].strip():
                head = head[end:]
                continue
        m = re.match(r"template\s*<", head)
        if m:
            depth, j = 1, m.end()
            while j < len(head) and depth:
                if head[j] in "([":
                    j = skip_group(head, j)
                    continue
                depth += {"<": 1, ">": -1}.get(head[j], 0)
                j += 1
            head = head[j:]
            continue
        return head


def skip_group(text, j):
    """The index after the (...) or [...] group opened at text[j]."""
    depth = 0
    while j < len(text):
        depth += {"(": 1, "[": 1, ")": -1, "]": -1}.get(text[j], 0)
        j += 1
        if depth == 0:
            break
    return j


QUALIFIERS = re.compile(r"(\s+|&&|&|(?<!\w)(const|volatile|noexcept\s*(\(\s*\))?|override|final|mutable|"
                        r"throw\s*\(\s*\)))$")


def is_linkage_block(head):
    return re.match(r'extern\s*"\s*"\s*$', head) is not None


def ends_in_member_initializer(head):
    """Whether the '{' after head opens a member's braced initializer in a constructor's
    initializer list ('A() : x_{1} {'), not the body."""
    flat = top_level_split(strip_template_prefix(head))
    m = re.search(r"\)[^:]*?(?<!:):(?!:)", flat)
    return m is not None and re.search(r"[\w>]\s*$", flat[m.end():]) is not None


def function_name(head):
    """The name in front of a signature's parameter list, or None when head is no signature."""
    head = strip_template_prefix(head)
    if re.match(r"(namespace|typedef|using)\b", head) or is_linkage_block(head):
        return None
    flat = top_level_split(head)
    # operator=, operator== and the like are no initializers.
    search = re.sub(r"operator\s*[^\s(\w]*", lambda m: " " * len(m.group(0)), flat)
    if re.search(r"(?<![=!<>+\-*/%&|^])=(?!=)", search):
        return None  # a variable's initializer: int x[] = {...}, auto f = [] {...}
    # A constructor's initializer list: the first single ':' after a parameter list.
    m = re.search(r"\)[^:]*?(?<!:):(?!:)", flat)
    if m:
        flat = flat[:m.end() - 1]
    arrow = flat.find("->")
    if arrow >= 0:
        flat = flat[:arrow]
    flat = flat.rstrip()
    while True:
        m = QUALIFIERS.search(flat)
        if not m or m.start() == len(flat):
            break
        flat = flat[:m.start()].rstrip()
    if not flat.endswith(")"):
        return None
    open_paren = flat.rfind("(")
    before = head[:open_paren].rstrip()
    if re.search(r"\brequires$", before):
        return None  # a requires-expression's body: requires(T t) { ... }
    m = re.search(r"operator\s*(\(\s*\)|\[\s*\]|[^\s\w(]+|[\w:<>&*\s]+?)\s*$", before)
    if m:
        name_start = m.start()
    else:
        m = re.search(r"[\w:~<>]*$", before)
        name_start = m.start() if m else len(before)
    name = re.sub(r"\s*::\s*", "::", re.sub(r"\s+", " ", before[name_start:].strip())).lstrip(":")
    name = re.sub(r"^[<>]+", "", name)
    if not name or not re.search(r"\w", name):
        return None
    return name


def scan_functions(stripped):
    """[(name, first line, line count)] of the function definitions in stripped code."""
    functions = []
    n = len(stripped)
    newlines = [m.start() for m in re.finditer("\n", stripped)]

    def line_at(offset):
        lo, hi = 0, len(newlines)
        while lo < hi:
            mid = (lo + hi) // 2
            if newlines[mid] < offset:
                lo = mid + 1
            else:
                hi = mid
        return lo + 1

    def scan_scope(i, closing):
        """Scans declarations from i to the brace closing this scope; returns the index after it."""
        head_start = i
        while i < n:
            c = stripped[i]
            if c == "(":
                i = skip_parens(i)  # braces in a parameter list or a member's initializer are no bodies
                continue
            if c == ";":
                head_start = i + 1
            elif c == "}":
                if closing:
                    return i + 1
                head_start = i + 1  # unbalanced (a macro's brace): go on at file scope
            elif c == "{":
                head = stripped[head_start:i]
                name = function_name(head)
                flat = strip_template_prefix(head)
                if name is not None and not ends_in_member_initializer(head):
                    end = match_brace(i)
                    first = head_start + len(head) - len(strip_access_specifiers(head))
                    start_line, end_line = line_at(first), line_at(end - 1)
                    functions.append((name, start_line, end_line - start_line + 1))
                    i = end
                    head_start = i
                    continue
                namespace = re.match(r"namespace\b", flat) or is_linkage_block(flat)
                if namespace or (re.match(r"(class|struct|union)\b", flat) and "=" not in top_level_split(flat)):
                    i = scan_scope(i + 1, True)
                    # 'struct X {...} x;' ends at the ';'; a namespace ends here.
                    head_start = i if namespace else head_start
                    continue
                # An initializer or an enum's list: skip it, it stays part of the declaration.
                i = match_brace(i)
                continue
            i += 1
        return i

    def skip_parens(i):
        """The index after the parenthesised group opened at i."""
        depth = 0
        while i < n:
            c = stripped[i]
            depth += {"(": 1, ")": -1}.get(c, 0)
            i += 1
            if depth == 0:
                break
        return i

    def match_brace(i):
        """The index after the brace closing the one at i."""
        depth = 0
        while i < n:
            c = stripped[i]
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    return i + 1
            i += 1
        return n

    scan_scope(0, False)
    return functions


def tracked_sources(root):
    files = subprocess.run(["git", "ls-files"], cwd=root, check=True, capture_output=True, text=True).stdout.split()
    return sorted(f for f in files if f.endswith(EXTENSIONS) and not f.startswith("tests/"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--list", action="store_true", help="print every file and function with its size; exit 0")
    parser.add_argument("files", nargs="*", help="files to check (default: tracked sources outside tests/)")
    args = parser.parse_args()
    root = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=os.path.dirname(os.path.abspath(__file__)),
                          check=True, capture_output=True, text=True).stdout.strip()
    files = args.files or [os.path.join(root, f) for f in tracked_sources(root)]
    over = 0
    for path in files:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        shown = os.path.relpath(path, root) if os.path.isabs(path) else path
        lines = len(text.splitlines())
        if args.list or lines > MAX_FILE_LINES:
            print(f"{shown}:1: (file): {lines} lines")
            over += lines > MAX_FILE_LINES
        stripped = drop_else_branches(text, strip_code(text))
        for name, line, count in scan_functions(stripped):
            if args.list or count > MAX_FUNCTION_LINES:
                print(f"{shown}:{line}: {name}: {count} lines")
                over += count > MAX_FUNCTION_LINES
    if args.list:
        return 0
    if over:
        print(f"{over} over the limits ({MAX_FILE_LINES} lines a file, {MAX_FUNCTION_LINES} a function)",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
