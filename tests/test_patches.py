"""incr.patches: unified diffs made with difflib and applied strictly, in memory."""

from __future__ import annotations

import difflib
import doctest
import os

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import incr.patches
from incr.patches import NO_NEWLINE, PatchError, apply_patch, make_patch, split_reply

# Lines from a small alphabet, so that random texts share many lines (the diffs then have
# context, moved and repeated lines); "\r", a tab, a space and a non-ASCII letter included.
LINE = st.text(alphabet="ab \t\r-+@\\é", max_size=4)
LINES = st.lists(LINE, max_size=12)


def text(lines, newline_at_end):
    body = "\n".join(lines)
    return body + "\n" if lines and newline_at_end else body


TEXT = st.builds(text, LINES, st.booleans())


@settings(max_examples=int(os.environ.get("INCR_PATCH_EXAMPLES", "400")), deadline=None)
@given(a=TEXT, b=TEXT, context=st.integers(0, 4))
@example(a="", b="", context=3)
@example(a="", b="x\n", context=3)
@example(a="x", b="", context=3)
@example(a="x\n", b="x", context=3)
@example(a="x", b="x\n", context=3)
@example(a="\n", b="", context=0)
@example(a="a\n\nb", b="a\n\nc", context=3)
def test_apply_undoes_make(a, b, context):
    patch = make_patch(a, b, context=context)
    assert apply_patch(a, patch) == b
    assert (patch == "") == (a == b)


@settings(max_examples=200, deadline=None)
@given(a=TEXT, b=TEXT)
def test_a_patch_without_headers_or_in_a_fence_applies_the_same(a, b):
    patch = make_patch(a, b)
    body = "".join(patch.splitlines(keepends=True)[2:])     # no ---/+++ lines
    assert apply_patch(a, body) == b
    assert apply_patch(a, f"Here is the fix:\n```diff\n{patch}```\nIt swaps a line.\n") == b


# --- by hand ---------------------------------------------------------------------------------

SQL = "SELECT count(*)\nFROM orders\nWHERE status = 'paid'\nGROUP BY day;\n"


def test_make_patch_is_a_unified_diff_with_no_newline_markers():
    assert make_patch("a\nb\n", "a\nc\n") == "--- a\n+++ b\n@@ -1,2 +1,2 @@\n a\n-b\n+c\n"
    assert make_patch("a", "b") == (f"--- a\n+++ b\n@@ -1 +1 @@\n-a\n{NO_NEWLINE}\n+b\n"
                                    f"{NO_NEWLINE}\n")
    # the same as GNU diff -u writes (difflib's lines, plus the marker)
    assert make_patch("", "x\n") == "--- a\n+++ b\n@@ -0,0 +1 @@\n+x\n"
    assert make_patch("same\n", "same\n") == ""


def test_several_hunks_apply_and_the_untouched_lines_stay():
    old = "".join(f"line {i}\n" for i in range(1, 21))
    new = old.replace("line 2\n", "line two\n").replace("line 18\n", "line 18\nextra\n")
    patch = make_patch(old, new, context=1)
    assert patch.count("@@ -") == 2
    assert apply_patch(old, patch) == new


def test_a_patch_against_the_wrong_text_raises_naming_the_hunk_and_line():
    patch = make_patch(SQL, SQL.replace("'paid'", "'paid' AND refunded = 0"))
    other = SQL.replace("FROM orders", "FROM payments")
    with pytest.raises(PatchError) as info:
        apply_patch(other, patch)
    msg = str(info.value)
    assert "hunk 1 (@@ -1,4 +1,4 @@)" in msg
    assert "'FROM orders\\n' does not match line 2 of the text, 'FROM payments\\n'" in msg
    assert "Nothing was changed" in msg and "give the whole new text" in msg
    assert isinstance(info.value, ValueError)


def test_the_failing_hunk_is_named_and_nothing_is_half_applied():
    old = "".join(f"l{i}\n" for i in range(1, 31))
    patch = ("@@ -2,3 +2,3 @@\n l2\n-l3\n+L3\n l4\n"
             "@@ -25,3 +25,3 @@\n l25\n-l26 changed meanwhile\n+L26\n l27\n")
    with pytest.raises(PatchError, match=r"hunk 2 \(@@ -25,3 \+25,3 @@\).*removed line "
                                         r"'l26 changed meanwhile\\n'.*line 26 of the text"):
        apply_patch(old, patch)
    # the first hunk alone is fine: the failure was the second's, and old is intact
    assert apply_patch(old, patch.split("@@ -25")[0]) == old.replace("l3\n", "L3\n")


def test_a_hunk_whose_context_matches_at_an_offset_applies_there():
    old = "".join(f"row {i}\n" for i in range(1, 11))
    patch = "@@ -3,3 +3,3 @@\n row 3\n-row 4\n+ROW 4\n row 5\n"
    moved = "intro 1\nintro 2\nintro 3\n" + old            # everything 3 lines further down
    assert apply_patch(moved, patch) == moved.replace("row 4\n", "ROW 4\n")
    # the offset found for the first hunk carries to the next one
    two = patch + "@@ -8,2 +8,2 @@\n row 8\n-row 9\n+ROW 9\n"
    assert apply_patch(moved, two) == moved.replace("row 4\n", "ROW 4\n").replace(
        "row 9\n", "ROW 9\n")
    # ...but only within max_offset lines, and by exact content
    with pytest.raises(PatchError, match="within 2 lines"):
        apply_patch(moved, patch, max_offset=2)
    with pytest.raises(PatchError, match="hunk 1"):
        apply_patch(moved.replace("row 5", "row  5"), patch)


def test_two_equally_near_places_is_an_error_not_a_guess():
    with pytest.raises(PatchError, match="both at line 1 and at line 5"):
        apply_patch("x\na\nz\nb\nx\n", "@@ -3 +3 @@\n-x\n+y\n")


def test_fenced_blocks():
    reply = ("The count included refunds; filter them out.\n\n"
             "```diff\n"
             "--- a\n+++ b\n"
             "@@ -3 +3 @@\n"
             "-WHERE status = 'paid'\n"
             "+WHERE status = 'paid' AND NOT refunded\n"
             "```\n\nThat should fix case paid_not_refunded.")
    assert split_reply(reply) == (
        "--- a\n+++ b\n@@ -3 +3 @@\n-WHERE status = 'paid'\n"
        "+WHERE status = 'paid' AND NOT refunded\n",
        "The count included refunds; filter them out.\n\n\n"
        "That should fix case paid_not_refunded.")
    assert apply_patch(SQL, reply) == SQL.replace("'paid'", "'paid' AND NOT refunded")
    # an unmarked fence holding a hunk, and ~~~ fences, are diffs too; a longer fence is
    # closed only by one as long
    for fence, info in (("```", ""), ("~~~", "patch"), ("````", "diff")):
        r = f"{fence}{info}\n@@ -1 +1 @@\n-SELECT count(*)\n+SELECT sum(amount)\n{fence}\n"
        assert apply_patch(SQL, r) == SQL.replace("count(*)", "sum(amount)")
    # a diff that changes lines holding ``` itself: its lines start with ' ', '+', '-'
    md = "Run:\n```sql\nSELECT 1;\n```\n"
    assert apply_patch(md, f"```diff\n{make_patch(md, md.replace('1', '2'))}```") == \
        md.replace("1", "2")
    # no diff at all; two diff blocks; a block never closed (a reply cut short)
    assert split_reply("```sql\nSELECT 1;\n```") == (None, "```sql\nSELECT 1;\n```")
    assert split_reply("just words") == (None, "just words")
    with pytest.raises(PatchError, match="2 diff blocks"):
        split_reply("```diff\n@@ -1 +1 @@\n-a\n+b\n```\n```diff\n@@ -2 +2 @@\n-c\n+d\n```")
    with pytest.raises(PatchError, match="never closed"):
        apply_patch(SQL, "```diff\n@@ -1 +1 @@\n-SELECT count(*)\n+SELECT 1")
    with pytest.raises(PatchError, match="holds no diff"):
        apply_patch(SQL, "```sql\nSELECT 1;\n```")


def test_no_newline_at_end_of_file():
    # the marker is honoured on either side
    assert apply_patch("a\nb", f"@@ -2 +2 @@\n-b\n{NO_NEWLINE}\n+b\n") == "a\nb\n"
    assert apply_patch("a\nb\n", f"@@ -2 +2 @@\n-b\n+c\n{NO_NEWLINE}\n") == "a\nc"
    with pytest.raises(PatchError, match="hunk 1"):      # says "no newline": the text has one
        apply_patch("a\nb\n", f"@@ -2 +2 @@\n-b\n{NO_NEWLINE}\n+c\n")
    with pytest.raises(PatchError, match="followed by more new lines"):
        apply_patch("a\n", f"@@ -1 +1,2 @@\n-a\n+b\n{NO_NEWLINE}\n+c\n")
    # a patch that never mentions it (as models write them) keeps the text's own ending
    sql = "SELECT count(*)\nFROM orders;"
    assert apply_patch(sql, "@@ -1,2 +1,2 @@\n SELECT count(*)\n-FROM orders;\n+FROM o;\n") \
        == "SELECT count(*)\nFROM o;"
    assert apply_patch(sql, "@@ -2 +2,2 @@\n FROM orders;\n+-- done\n") == \
        "SELECT count(*)\nFROM orders;\n-- done"


def test_a_patch_that_adds_to_an_empty_text():
    assert apply_patch("", "@@ -0,0 +1,2 @@\n+SELECT 1;\n+SELECT 2;\n") == \
        "SELECT 1;\nSELECT 2;\n"
    assert apply_patch("", make_patch("", "x")) == "x"
    with pytest.raises(PatchError, match="has only 0 lines"):
        apply_patch("", "@@ -1 +1 @@\n-a\n+b\n")


def test_miscounted_headers_are_read_from_the_body_and_the_content_still_decides():
    # models miscount: the header says 2 old lines, the body has 3 (and vice versa)
    assert apply_patch(SQL, "@@ -1,2 +1,2 @@\n SELECT count(*)\n-FROM orders\n+FROM o\n"
                            " WHERE status = 'paid'\n") == SQL.replace("FROM orders", "FROM o")
    assert apply_patch(SQL, "@@ -1,9 +1,9 @@\n SELECT count(*)\n-FROM orders\n+FROM o\n"
                            "@@ -4 +4 @@\n-GROUP BY day;\n+GROUP BY 1;\n") == \
        SQL.replace("FROM orders", "FROM o").replace("day;", "1;")
    # a last hunk with fewer lines than its header counts may be a reply cut short...
    short = "@@ -1,4 +1,4 @@\n SELECT count(*)\n-FROM orders\n+FROM o\n"
    with pytest.raises(PatchError, match="cut short"):
        apply_patch(SQL, short)
    # ...unless the patch is known to be whole: a closed fence, or complete=True
    fixed = SQL.replace("FROM orders", "FROM o")
    assert apply_patch(SQL, short, complete=True) == fixed
    assert apply_patch(SQL, f"```diff\n{short}```\n") == fixed
    # an SQL comment removed ("-- x" -> "--- x") is a line, not a file header
    old = "-- total\nSELECT 1;\n"
    assert apply_patch(old, make_patch(old, "++ total\nSELECT 1;\n")) == "++ total\nSELECT 1;\n"
    # trailing whitespace that models strip from an empty context line
    old = "a\n\nb\n"
    assert apply_patch(old, "@@ -1,3 +1,3 @@\n a\n\n-b\n+c\n") == "a\n\nc\n"


def test_bad_patches_say_what_is_wrong():
    with pytest.raises(PatchError, match="no hunk"):
        apply_patch(SQL, "--- a\n+++ b\nsomething\n")
    with pytest.raises(PatchError, match="line numbers are needed"):
        apply_patch(SQL, "@@ ... @@\n-FROM orders\n+FROM o\n")
    with pytest.raises(PatchError, match="second file"):
        apply_patch(SQL, "--- a\n+++ b\n@@ -2 +2 @@\n-FROM orders\n+FROM o\n"
                         "--- c\n+++ d\n@@ -1 +1 @@\n-x\n+y\n")
    with pytest.raises(PatchError, match=r"line 4 of the patch, 'Hope this helps!'"):
        apply_patch(SQL, "@@ -2 +2 @@\n-FROM orders\n+FROM o\nHope this helps!\n")
    with pytest.raises(TypeError, match="must be a str"):
        apply_patch(b"x", "")
    with pytest.raises(ValueError, match="max_offset"):
        apply_patch("x", "", max_offset=-1)
    assert apply_patch(SQL, "") == SQL and apply_patch(SQL, "\n\n") == SQL


def test_a_gnu_style_diff_of_difflib_itself_applies():
    # the unified_diff output of the standard library, with its dated headers
    old, new = SQL, SQL.replace("day", "week")
    patch = "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                         "a/q.sql", "b/q.sql", "2026-01-01", "2026-01-02"))
    assert apply_patch(old, "diff --git a/q.sql b/q.sql\nindex 1..2 100644\n" + patch) == new


def test_the_docstring_examples_run():
    failed, attempted = doctest.testmod(incr.patches)
    assert (failed, attempted) == (0, 2)
