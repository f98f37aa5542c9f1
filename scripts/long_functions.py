#!/usr/bin/env python3
"""Lists C++ function definitions longer than a limit (80 lines by default), from signature to closing brace.

Usage: scripts/long_functions.py [--limit N] [PATH ...]   (default paths: src tools; src/kernels is left out)

A heuristic reader, not a compiler: comments, string and character literals (raw strings included) and preprocessor
lines are blanked, then braces are matched. A brace at namespace or class scope opens a function body when the text
before it ends in a parameter list (with trailing qualifiers or a constructor's initializer list); other braces there
are namespaces, classes or initializers (tables), which are not functions. A table inside a function (a multi-line
initializer after `return` or `=`) does not count towards its length. Exit status 1 when any function is listed.
"""
import argparse
import pathlib
import re
import sys

SCOPE_KEYWORDS = re.compile(r'\b(namespace|class|struct|union|enum)\b|\bextern\s*""')
QUALIFIERS = re.compile(r'(\s*\b(const|noexcept|override|final|mutable|volatile|try)\b|\s*&&?|\s*->[^;{}()]*)*\s*$')


def blank(text):
    """Returns text with comments, literals and preprocessor lines replaced by spaces (newlines kept)."""
    out = []
    i, n = 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if line_start and c == '#':
            j = i
            while j < n and text[j] != '\n':  # a directive, with its backslash continuations
                j = j + 2 if text[j] == '\\' and j + 1 < n else j + 1
            out.append(re.sub(r'[^\n]', ' ', text[i:j]))
            i = j
            continue
        if c == '\n':
            line_start = True
            out.append(c)
            i += 1
            continue
        if not c.isspace():
            line_start = False
        if text.startswith('//', i):
            j = text.find('\n', i)
            j = n if j < 0 else j
            out.append(' ' * (j - i))
            i = j
        elif text.startswith('/*', i):
            j = text.find('*/', i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r'[^\n]', ' ', text[i:j]))
            i = j
        elif c == 'R' and text.startswith('"', i + 1) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == '_')):
            open_paren = text.find('(', i + 2)
            delimiter = text[i + 2:open_paren]
            j = text.find(')' + delimiter + '"', open_paren)
            j = n if j < 0 else j + len(delimiter) + 2
            out.append('""' + re.sub(r'[^\n]', ' ', text[i + 2:j]))
            i = j
        elif c in '"\'':
            if c == "'" and i > 0 and text[i - 1].isalnum():  # a digit separator: 1'000'000
                out.append(' ')
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != '\n':
                j += 2 if text[j] == '\\' else 1
            out.append(c + ' ' * (j - i - 1) + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return ''.join(out)


def is_function_header(header):
    """Whether the text before a brace at namespace or class scope ends a function's signature."""
    if SCOPE_KEYWORDS.search(header) and '(' not in header:
        return False
    stripped = QUALIFIERS.sub('', header)
    if stripped.endswith(')'):
        return not re.search(r'=\s*[^=]*\($', header.split('(')[0] + '(')  # `T x = f(...) {` is not a signature
    # A constructor's initializer list: `) : a_(x), b_{y} {` ends in `)` or in a brace-initialized member.
    return bool(re.search(r'\)\s*(noexcept\s*)?:[^;]*[)}]\s*$', header))


def function_end(text, open_brace):
    """The position after the body opening at text[open_brace], and how many of its lines are inside tables: the
    lines strictly between the braces of a multi-line initializer after `return` or `=` (a settings table)."""
    depth, j, n = 1, open_brace + 1, len(text)
    table_lines = 0
    table_depth = None  # the depth inside the outermost table, while in one
    table_start = 0
    while j < n and depth:
        c = text[j]
        if c == '{':
            if table_depth is None and re.search(r'(\breturn|=)\s*$', text[max(0, j - 40):j]):
                table_depth, table_start = depth + 1, j
            depth += 1
        elif c == '}':
            if depth == table_depth:
                table_lines += max(0, text.count('\n', table_start, j) - 1)
                table_depth = None
            depth -= 1
        j += 1
    return j, table_lines


def long_functions(path, limit):
    text = blank(path.read_text(encoding='utf-8', errors='replace'))
    found = []
    header_start = 0  # where the current declaration's text begins
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in ';}':
            header_start = i + 1
        elif c == '{':
            header = text[header_start:i]
            if is_function_header(' '.join(header.split())):
                j, table_lines = function_end(text, i)
                first = text.count('\n', 0, header_start + len(header) - len(header.lstrip())) + 1
                last = text.count('\n', 0, j - 1) + 1
                if last - first + 1 - table_lines > limit:
                    name = re.search(r'([~\w:<>=!+\-*/\[\]]+)\s*\(', ' '.join(header.split()))
                    found.append((last - first + 1 - table_lines, first, name.group(1) if name else '?'))
                i = j
                header_start = j
                continue
            if SCOPE_KEYWORDS.search(header):
                header_start = i + 1  # a namespace or class body: its members are declarations of their own
            else:  # an initializer (a table): skip it, the declaration goes on after it
                depth, j = 1, i + 1
                while j < n and depth:
                    depth += {'{': 1, '}': -1}.get(text[j], 0)
                    j += 1
                i = j
                continue
        i += 1
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--limit', type=int, default=80)
    parser.add_argument('paths', nargs='*', default=['src', 'tools'])
    args = parser.parse_args()
    root = pathlib.Path(__file__).resolve().parent.parent
    files = []
    for p in args.paths:
        p = pathlib.Path(p)
        if p.is_dir():
            files += [f for f in sorted(p.rglob('*')) if f.suffix in ('.cpp', '.h', '.cc') and 'kernels' not in f.parts]
        else:
            files.append(p)
    rows = []
    for f in files:
        for lines, line, name in long_functions(f, args.limit):
            rows.append((lines, f'{f}:{line}', name))
    for lines, where, name in sorted(rows, reverse=True):
        print(f'{lines:5d}  {where}  {name}')
    return 1 if rows else 0


if __name__ == '__main__':
    sys.exit(main())
