"""PostgreSQL's text of an array (`{1,2}`, `{{"a b",NULL},{c,d}}`, `[0:1]={1,2}`) -> a JSON list
of its elements, each through the element type's converter (cdc/typemap.py builds them)."""

from __future__ import annotations

from collections.abc import Callable

from cdc.pgtypes import Converter


def array_converter(element_conv: Converter, delimiter: str) -> Callable[[str], list]:
    def convert(text: str) -> list:
        if text[:1] == "[":  # dimension decoration '[0:1]={1,2}': bounds are dropped
            text = text[text.index("=") + 1 :]
        if text == "{}":
            return []
        # Fast path: one dimension, no quoting, escaping or spacing.
        if text[:1] == "{" and text[-1] == "}":
            inner = text[1:-1]
            if (
                "{" not in inner
                and "}" not in inner
                and '"' not in inner
                and "\\" not in inner
                and " " not in inner
            ):
                return [None if item == "NULL" else element_conv(item) for item in inner.split(delimiter)]
        return parse_array(text, delimiter, element_conv)

    return convert


def parse_array(text: str, delimiter: str, element_conv: Converter) -> list:
    """The general array literal parser (quotes, backslash escapes, nesting, whitespace)."""
    n = len(text)
    i = 0
    while i < n and text[i].isspace():
        i += 1
    if i >= n or text[i] != "{":
        raise ValueError(f"not an array literal: {text!r}")
    root: list = []
    stack: list[list] = []
    while i < n:
        c = text[i]
        if c == "{":
            new: list = []
            if stack:
                stack[-1].append(new)
            else:
                root = new
            stack.append(new)
            i += 1
        elif c == "}":
            if not stack:
                raise ValueError(f"unbalanced braces in array literal: {text!r}")
            stack.pop()
            i += 1
            if not stack:
                if text[i:].strip():
                    raise ValueError(f"junk after array literal: {text!r}")
                return root
        elif c == delimiter or c.isspace():
            i += 1
        elif not stack:
            raise ValueError(f"not an array literal: {text!r}")
        elif c == '"':
            i += 1
            chunks: list[str] = []
            while True:
                quote = text.find('"', i)
                backslash = text.find("\\", i, quote if quote >= 0 else n)
                if quote < 0:
                    raise ValueError(f"unterminated quoted element in array literal: {text!r}")
                if backslash < 0:
                    chunks.append(text[i:quote])
                    i = quote + 1
                    break
                chunks.append(text[i:backslash])
                if backslash + 1 >= n:
                    raise ValueError(f"dangling backslash in array literal: {text!r}")
                chunks.append(text[backslash + 1])
                i = backslash + 2
            stack[-1].append(element_conv("".join(chunks)))
        else:
            chunks = []
            protected = 0  # chunks up to here came from escapes (or precede one): never stripped
            while i < n:
                c = text[i]
                if c == delimiter or c == "}":
                    break
                if c == "\\":
                    if i + 1 >= n:
                        raise ValueError(f"dangling backslash in array literal: {text!r}")
                    chunks.append(text[i + 1])
                    protected = len(chunks)
                    i += 2
                elif c in '{"':
                    raise ValueError(f"unexpected {c!r} in array literal: {text!r}")
                else:
                    chunks.append(c)
                    i += 1
            # Trailing unescaped whitespace of an unquoted element is not part of it.
            item = "".join(chunks[:protected]) + "".join(chunks[protected:]).rstrip()
            if not protected and item.upper() == "NULL":
                stack[-1].append(None)
            else:
                stack[-1].append(element_conv(item))
    raise ValueError(f"unbalanced braces in array literal: {text!r}")
