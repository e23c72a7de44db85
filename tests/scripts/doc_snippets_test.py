#!/usr/bin/env python3
"""Doc pages whose code blocks are taken from a tested example: every ```cpp block of the page
must appear in the example, line for line (indentation aside), so the page cannot drift from the
code that CTest builds and runs.

Run: python3 tests/scripts/doc_snippets_test.py (CTest runs it as test_doc_snippets)."""
import os
import re
import unittest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")

# page -> the example its blocks come from
PAGES = {"docs/quickstart.md": "examples/quickstart.cpp"}


def cpp_blocks(markdown):
    return re.findall(r"```cpp\n(.*?)```", markdown, re.S)


def lines(text):
    """Non-empty lines without their leading and trailing blanks."""
    return [line.strip() for line in text.splitlines() if line.strip()]


def contains(haystack, needle):
    n = len(needle)
    return any(haystack[i:i + n] == needle for i in range(len(haystack) - n + 1))


def missing_blocks(markdown, source):
    """The page's blocks that do not appear, as a run of lines, in the source."""
    src = lines(source)
    return [b for b in cpp_blocks(markdown) if not contains(src, lines(b))]


class DocSnippets(unittest.TestCase):
    def test_every_block_is_in_its_example(self):
        for page, example in PAGES.items():
            with open(os.path.join(ROOT, page)) as f:
                markdown = f.read()
            with open(os.path.join(ROOT, example)) as f:
                source = f.read()
            self.assertGreaterEqual(len(cpp_blocks(markdown)), 5, page)
            self.assertEqual(missing_blocks(markdown, source), [], f"{page}: blocks not in {example}")

    def test_a_drifted_block_is_found(self):
        source = "int main() {\n  int a = 1;\n  int b = 2;\n  return a + b;\n}\n"
        good = "text\n```cpp\nint a = 1;\nint b = 2;\n```\n"
        self.assertEqual(missing_blocks(good, source), [])
        drifted = "text\n```cpp\nint a = 1;\nint b = 3;\n```\n"
        self.assertEqual(len(missing_blocks(drifted, source)), 1)
        out_of_order = "```cpp\nint b = 2;\nint a = 1;\n```\n"
        self.assertEqual(len(missing_blocks(out_of_order, source)), 1)


if __name__ == "__main__":
    unittest.main()
