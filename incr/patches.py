"""Unified diffs of one text, in memory: :func:`make_patch` writes one, :func:`apply_patch`
applies one strictly. Internal to incr (``chat_generator(patch=True)`` uses it), importable
but not part of the public surface.

What "strictly" means here, the invariants :func:`apply_patch` keeps:

- every context line and every removed line of a hunk equals a line of the text exactly
  (same characters, same line ending); nothing is matched approximately (no "fuzz" that
  ignores context lines, no whitespace folding);
- a hunk applies at the line its ``@@`` header states, or, when the text there differs, at the
  nearest place within ``max_offset`` lines where all its lines match (an offset found for one
  hunk carries to the next, as in GNU ``patch``); two equally near places is an error, not a
  guess; hunks apply in order and never overlap;
- either every hunk applies or nothing does: the result is built apart from the text and
  returned whole, or :class:`PatchError` is raised and the caller's text is all there is.

Texts are split into lines at ``"\\n"`` only (a ``"\\r"`` stays part of its line), so any
``str`` round-trips: ``apply_patch(a, make_patch(a, b)) == b``.
"""

from __future__ import annotations

import difflib
import re

__all__ = ["MAX_OFFSET", "NO_NEWLINE", "PatchError", "apply_patch", "make_patch",
           "split_reply"]

#: The marker line that follows a diff line whose text has no newline at its end.
NO_NEWLINE = "\\ No newline at end of file"

#: How many lines away from the line its header states a hunk may apply (exact content).
MAX_OFFSET = 50

_HUNK = re.compile(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_FENCE = re.compile(r"(`{3,}|~{3,})[ \t]*([^`\s]*)[^`]*")
_DIFF_INFO = {"diff", "patch", "udiff"}
_ADVICE = ("Make the diff against the text as it is now (every context and removed line "
           "exactly as in it), or give the whole new text instead.")


class PatchError(ValueError):
    """A patch that cannot be read, or that does not apply to the text it was given; the text
    was not changed."""


def _lines(text: str) -> list[str]:
    """``text`` as lines split at ``"\\n"`` only, each keeping its ``"\\n"`` (the last one may
    have none)."""
    parts = text.split("\n")
    out = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        out.append(parts[-1])
    return out


def make_patch(old: str, new: str, *, context: int = 3, fromfile: str = "a",
               tofile: str = "b") -> str:
    """A unified diff (``difflib``) that turns ``old`` into ``new``, with ``context`` lines of
    context around each change and the ``\\ No newline at end of file`` marker where a text
    does not end with a newline. ``""`` when the texts are equal.

    >>> print(make_patch("a\\nb\\n", "a\\nc\\n"), end="")
    --- a
    +++ b
    @@ -1,2 +1,2 @@
     a
    -b
    +c
    """
    for name, v in (("old", old), ("new", new)):
        if not isinstance(v, str):
            raise TypeError(f"make_patch: {name} must be a str, got {type(v).__name__}")
    if not isinstance(context, int) or isinstance(context, bool) or context < 0:
        raise ValueError(f"make_patch: context must be an int >= 0, got {context!r}")
    out = []
    for line in difflib.unified_diff(_lines(old), _lines(new), fromfile, tofile, n=context):
        out.append(line if line.endswith("\n") else f"{line}\n{NO_NEWLINE}\n")
    return "".join(out)


# --- reading a patch -------------------------------------------------------------------------


class _Hunk:
    """One hunk: its number (from 1), header, the old-side start line it states, and its old
    and new lines (each with its line ending, or none when marked "No newline")."""

    __slots__ = ("number", "header", "old_start", "old", "old_kinds", "new")

    def __init__(self, number: int, header: str, old_start: int):
        self.number = number
        self.header = header
        self.old_start = old_start
        self.old: list[str] = []
        self.old_kinds: list[str] = []      # "context" or "removed", beside each old line
        self.new: list[str] = []

    @property
    def name(self) -> str:
        return f"hunk {self.number} ({self.header})"


def _body_line(line: str) -> tuple[str, str] | None:
    """A hunk body line as (tag, text), tag one of ``" +-\\\\"``; an empty line is an empty
    context line (its leading space lost); ``None`` for a line that is none of these."""
    if line == "":
        return " ", ""
    if line[0] in " +-\\":
        return line[0], line[1:]
    return None


def _is_file_header(lines: list[str], i: int) -> bool:
    return (lines[i].startswith("--- ") and i + 1 < len(lines)
            and lines[i + 1].startswith("+++ "))


def _ends_hunk(lines: list[str], i: int) -> bool:
    """Line ``i`` starts something that is not a hunk body: the next hunk, a file header."""
    return (lines[i].startswith("@@") or lines[i].startswith("diff ")
            or (_is_file_header(lines, i) and i + 2 < len(lines)
                and lines[i + 2].startswith("@@")))


def _by_counts(lines: list[str], i: int, old_n: int, new_n: int):
    """The body that the header's counts describe, from line ``i``: ``(body, next line)``, or
    ``None`` when the lines do not fit the counts."""
    body: list[tuple[str, str]] = []
    o = n = 0
    while o < old_n or n < new_n:
        if i >= len(lines):
            return None
        parsed = _body_line(lines[i])
        if parsed is None:
            return None
        if parsed[0] == "\\":
            if not body:
                return None
            body.append(parsed)
            i += 1
            continue
        o += parsed[0] in " -"
        n += parsed[0] in " +"
        if o > old_n or n > new_n:
            return None
        body.append(parsed)
        i += 1
    if i < len(lines) and lines[i].startswith("\\"):
        body.append(("\\", lines[i][1:]))
        i += 1
    return body, i


def _by_extent(lines: list[str], i: int, header: str, number: int):
    """The body as every line up to the next hunk or file header (or the end), blank lines at
    its end left out: for a header whose counts are wrong (models miscount)."""
    j = i
    while j < len(lines) and not _ends_hunk(lines, j):
        j += 1
    end = j
    while end > i and not lines[end - 1].strip():
        end -= 1
    body = []
    for k in range(i, end):
        parsed = _body_line(lines[k])
        if parsed is None:
            raise PatchError(f"hunk {number} ({header}): line {k + 1} of the patch, "
                             f"{lines[k]!r}, is not a diff line (a diff line starts with ' ', "
                             f"'+', '-' or '\\'). {_ADVICE}")
        body.append(parsed)
    return body, j


def _parse(patch: str, complete: bool) -> list[_Hunk]:
    """The hunks of ``patch``. ``complete``: the patch is known to end where it was meant
    to (a closed fence, a reply that was not cut short), so a last hunk shorter than its
    header says was miscounted, not cut."""
    lines = patch.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    hunks: list[_Hunk] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if _is_file_header(lines, i):
            if hunks:
                raise PatchError(f"line {i + 1} of the patch starts the diff of a second "
                                 f"file ({line!r}); a patch here changes one text only")
            i += 2
            continue
        if line.startswith("@@"):
            m = _HUNK.match(line)
            number = len(hunks) + 1
            if m is None:
                raise PatchError(f"hunk {number}: its header {line!r} (line {i + 1} of the "
                                 "patch) is not '@@ -start,count +start,count @@'; line "
                                 f"numbers are needed to place it. {_ADVICE}")
            header = m.group(0)
            old_n = 1 if m.group(2) is None else int(m.group(2))
            new_n = 1 if m.group(4) is None else int(m.group(4))
            got = _by_counts(lines, i + 1, old_n, new_n)
            if got is not None:
                k = got[1]
                while k < len(lines) and not lines[k].strip():
                    k += 1
                if k < len(lines) and not _ends_hunk(lines, k) and _body_line(lines[k]):
                    got = None      # more diff lines follow: the counts are too small
            if got is None:
                body, nxt = _by_extent(lines, i + 1, header, number)
                o = sum(t in " -" for t, _ in body)
                n = sum(t in " +" for t, _ in body)
                if not complete and nxt >= len(lines) and (o < old_n or n < new_n):
                    raise PatchError(f"{_hunk_name(number, header)} is cut short: its header "
                                     f"counts {old_n} old and {new_n} new lines, the patch "
                                     f"ends after {o} and {n}. Send the whole diff.")
            else:
                body, nxt = got
            hunks.append(_hunk(number, header, int(m.group(1)), body))
            i = nxt
            continue
        if hunks and line.strip() and not line.startswith("diff "):
            raise PatchError(f"line {i + 1} of the patch, {line!r}, is not part of any hunk "
                             f"(after {_hunk_name(len(hunks), hunks[-1].header)}). {_ADVICE}")
        i += 1          # text before the first hunk (git's "diff --git", "index"), blank lines
    return hunks


def _hunk_name(number: int, header: str) -> str:
    return f"hunk {number} ({header})"


def _hunk(number: int, header: str, old_start: int, body: list[tuple[str, str]]) -> _Hunk:
    h = _Hunk(number, header, old_start)
    last = None                   # the side(s) the previous line went to
    ended = {"old": False, "new": False}
    for tag, text in body:
        if tag == "\\":
            if last is None:
                raise PatchError(f"{h.name}: a '\\ No newline at end of file' marker "
                                 "follows no line")
            for side in last:
                lst = h.old if side == "old" else h.new
                if lst[-1].endswith("\n"):
                    lst[-1] = lst[-1][:-1]
                ended[side] = True
            continue
        sides = {" ": ("old", "new"), "-": ("old",), "+": ("new",)}[tag]
        for side in sides:
            if ended[side]:
                raise PatchError(f"{h.name}: a line marked '\\ No newline at end of file' "
                                 f"is followed by more {side} lines; only the last line of "
                                 "a text can lack its newline")
            if side == "old":
                h.old.append(text + "\n")
                h.old_kinds.append("context" if tag == " " else "removed")
            else:
                h.new.append(text + "\n")
        last = sides
    if not h.old and not h.new:
        raise PatchError(f"{h.name} has no lines. {_ADVICE}")
    return h


# --- fenced blocks ---------------------------------------------------------------------------


def split_reply(text: str) -> tuple[str | None, str]:
    """A model's reply as ``(diff, rationale)``: the diff is the content of its one fenced
    block marked ``diff``/``patch`` (or unmarked, holding a ``@@`` hunk header), the
    rationale the text around it, stripped. A reply without fences whose lines include a
    hunk header is a diff as a whole (rationale ``""``). ``(None, text)`` when there is no
    diff. Raises :class:`PatchError` for two diff blocks or one that is never closed."""
    lines = text.split("\n")
    blocks = []                       # (first line, closing line or None, info, body lines)
    i = 0
    while i < len(lines):
        m = _FENCE.fullmatch(lines[i].rstrip())
        if m is None:
            i += 1
            continue
        fence = m.group(1)
        j = i + 1
        while j < len(lines):
            close = lines[j].rstrip()
            if close and set(close) == {fence[0]} and len(close) >= len(fence):
                break
            j += 1
        blocks.append((i, j if j < len(lines) else None, m.group(2).lower(), lines[i + 1:j]))
        i = j + 1
    diffs = [b for b in blocks
             if b[2] in _DIFF_INFO or (not b[2] and any(ln.startswith("@@") for ln in b[3]))]
    if len(diffs) > 1:
        raise PatchError(f"the reply holds {len(diffs)} diff blocks; one block with every "
                         "hunk was asked for")
    if diffs:
        start, end, _, body = diffs[0]
        if end is None:
            raise PatchError("the diff block is never closed (was the reply cut short?)")
        rationale = "\n".join(lines[:start] + lines[end + 1:]).strip()
        return "\n".join(body) + "\n", rationale
    if not blocks and any(ln.startswith("@@") for ln in lines):
        return text, ""
    return None, text


# --- applying --------------------------------------------------------------------------------


def _find(src: list[str], h: _Hunk, want: int, floor: int, max_offset: int) -> int:
    """Where hunk ``h`` applies: the place nearest to ``want`` (0-based), at or after
    ``floor``, within ``max_offset`` lines, where its old lines equal the text's."""
    k = len(h.old)

    def fits(p: int) -> bool:
        return floor <= p and p + k <= len(src) and src[p:p + k] == h.old

    if fits(want):
        return want
    for d in range(1, max_offset + 1):
        here = [p for p in (want - d, want + d) if fits(p)]
        if len(here) == 2:
            raise PatchError(f"{h.name} matches the text both at line {here[0] + 1} and at "
                             f"line {here[1] + 1}, equally near to line {want + 1} where it "
                             "says it goes; give it more context lines so that it fits one "
                             "place only")
        if here:
            return here[0]
    raise PatchError(_why_not(src, h, want, floor, max_offset))


def _why_not(src: list[str], h: _Hunk, want: int, floor: int, max_offset: int) -> str:
    at = min(max(want, floor, 0), len(src))
    what = f"{h.name} does not apply"
    for j, line in enumerate(h.old):
        if at + j >= len(src):
            what += (f": its {h.old_kinds[j]} line {line!r} would be line {at + j + 1} of "
                     f"the text, which has only {len(src)} lines")
            break
        if src[at + j] != line:
            what += (f": its {h.old_kinds[j]} line {line!r} does not match line {at + j + 1} "
                     f"of the text, {src[at + j]!r}")
            break
    else:
        what += f" at line {at + 1}"
    return (f"{what}; nor do its context and removed lines match anywhere within {max_offset} "
            f"lines of there. Nothing was changed. {_ADVICE}")


def apply_patch(old: str, patch: str, *, max_offset: int = MAX_OFFSET,
                complete: bool = False) -> str:
    """``old`` with the unified diff ``patch`` applied, strictly (see the module's
    docstring). ``---``/``+++`` headers are optional; text before the first hunk is ignored; a
    patch wrapped in a fenced block (````` ```diff `````) is read from inside it. A patch with
    no ``\\ No newline at end of file`` marker at all leaves the text's last newline (or its
    absence) as it is. An empty patch changes nothing.

    A hunk whose header counts other numbers of lines than it has is read by its lines (the
    content still has to match). Only its last hunk having fewer lines than its header says
    is refused, as a patch that may have been cut short, unless the patch is known to be
    whole: in a closed fence, or ``complete=True`` (a model's reply that was not cut short).

    Runtime complexity: O(lines of the text + lines of the patch x (2 max_offset + 1)).

    >>> apply_patch("a\\nb\\n", "@@ -2 +2 @@\\n-b\\n+c\\n")
    'a\\nc\\n'

    Raises :class:`PatchError` (a ``ValueError``) naming the hunk and the line that did not
    match; the text is never partly changed.
    """
    if not isinstance(old, str):
        raise TypeError(f"apply_patch: the text must be a str, got {type(old).__name__}")
    if not isinstance(patch, str):
        raise TypeError(f"apply_patch: the patch must be a str, got {type(patch).__name__}")
    if not isinstance(max_offset, int) or isinstance(max_offset, bool) or max_offset < 0:
        raise ValueError(f"apply_patch: max_offset must be an int >= 0, got {max_offset!r}")
    if any(_FENCE.fullmatch(ln.rstrip()) for ln in patch.split("\n")):
        found, _ = split_reply(patch)
        if found is None:
            raise PatchError("the patch is in a fenced block that holds no diff")
        return _apply(old, found, max_offset, complete=True)
    return _apply(old, patch, max_offset, complete=bool(complete))


def _apply(old: str, patch: str, max_offset: int, complete: bool) -> str:
    hunks = _parse(patch, complete)
    if not hunks:
        if not patch.strip():
            return old
        raise PatchError("the patch has no hunk (a hunk starts with a line "
                         "'@@ -start,count +start,count @@'). " + _ADVICE)
    marked = any(not ln.endswith("\n") for h in hunks for ln in (*h.old, *h.new))
    # A patch that never says "No newline at end of file" does not speak of the last
    # newline (models never write the marker): the text's own is kept.
    added = bool(old) and not marked and not old.endswith("\n")
    src = _lines(old + "\n" if added else old)
    out: list[str] = []
    floor = 0
    shift = 0
    for h in hunks:
        stated = (h.old_start - 1 if h.old else h.old_start) + shift
        pos = _find(src, h, stated, floor, max_offset)
        shift = pos - (h.old_start - 1 if h.old else h.old_start)
        out.extend(src[floor:pos])
        out.extend(h.new)
        floor = pos + len(h.old)
    out.extend(src[floor:])
    for line in out[:-1]:
        if not line.endswith("\n"):
            raise PatchError(f"the patch marks the line {line!r} '\\ No newline at end of "
                             "file' but the text goes on after it. " + _ADVICE)
    result = "".join(out)
    if added and result.endswith("\n"):
        result = result[:-1]
    return result
