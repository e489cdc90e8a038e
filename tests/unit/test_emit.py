"""The streaming YAML emitter: whatever it writes, PyYAML reads back as the same data."""

from __future__ import annotations

import math

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from couler.compilers.emit import to_yaml

# Text that stresses quoting: YAML indicators, look-alikes of other types, line breaks of
# every kind, characters YAML forbids raw, and non-ASCII.
tricky = st.sampled_from([
    "", " ", "-", "- a", "?", ":", "a:", "a: b", "a #b", "#", "&a", "*a", "!t", "|", ">", "%",
    "@", "`", "'", '"', "{", "}", "[", "]", ",", "yes", "No", "ON", "off", "y", "n", "null",
    "Null", "~", "true", "False", "1", "-1", "+1", "1.5", ".5", "1e3", "1.0e+3", "0x1F",
    "0o17", "017", "1_000", "12:30", "12:30:45", ".inf", "-.Inf", ".NaN", "2024-01-01",
    "2001-12-14t21:59:43.10-05:00", "<<", "=", "\t", "a\tb", "\n", "a\n", "a\n\n", "\na",
    " a\nb", "a\r\nb", "a\rb", "\x85", "\u2028", "\u2029", "\ufeff", "\x00", "\x07", "\x7f",
    "\x9f", "héllo", "日本", "😀", "a\\b", "{{inputs.parameters.x}}", "s3://b/k", "alpine:3.20",
    "*/30 * * * *", "a ", " a", "a  b", "a\n  b\n", "x\n \n", "key: |\n  x",
    "-c", "- ", "-", "--", "--- a", "---", "... a", "?x", "? x", ":x", ": x", "a'b", 'a"b',
    "a#b", "a #b", "a,b", "a]", "a[b]", "a{b}", "x: y", "a:b", "a:", "é", "a\u00a0b", "\u00a0",
    "-1.5", "-.inf", "- a: b", "echo \"it was heads\"", "!!str", "a !b", "a&b", "a*b",
])
texts = st.one_of(tricky, st.text(max_size=40), st.text(alphabet="ab:-# \n'\"\\{}", max_size=12))
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False), texts,
)
documents = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(texts, children, max_size=4),
    ),
    max_leaves=30,
)


@settings(max_examples=600, deadline=None)
@given(documents)
def test_round_trip_through_pyyaml(doc: object) -> None:
    assert yaml.safe_load(to_yaml(doc)) == doc


@given(st.dictionaries(texts, documents, min_size=1, max_size=5))
@settings(max_examples=200, deadline=None)
def test_mapping_documents_round_trip(doc: dict[str, object]) -> None:
    text = to_yaml(doc)
    assert yaml.safe_load(text) == doc
    assert list(yaml.safe_load(text)) == list(doc)  # key order kept


def test_special_floats() -> None:
    back = yaml.safe_load(to_yaml({"a": math.inf, "b": -math.inf, "c": math.nan, "d": 1e-05}))
    assert back["a"] == math.inf and back["b"] == -math.inf and math.isnan(back["c"])
    assert back["d"] == 1e-05 and isinstance(back["d"], float)


def test_layout_matches_pyyaml_block_style() -> None:
    doc = {"spec": {"templates": [{"name": "a", "args": ["x", "y"]}], "empty": [], "none": {}},
           "script": "import os\nprint(os.getcwd())\n", "image": "alpine:3.20"}
    assert to_yaml(doc) == (
        "spec:\n"
        "  templates:\n"
        "  - name: a\n"
        "    args:\n"
        "    - x\n"
        "    - y\n"
        "  empty: []\n"
        "  none: {}\n"
        "script: |\n"
        "  import os\n"
        "  print(os.getcwd())\n"
        "image: alpine:3.20\n"
    )


def test_plain_only_when_it_reads_back_as_the_same_string() -> None:
    assert to_yaml(["plain text", "yes", "1.5", "{{x}}", "-c", 'echo "hi"', "- x"]) == (
        '- plain text\n- "yes"\n- "1.5"\n- "{{x}}"\n- -c\n- echo "hi"\n- "- x"\n'
    )


def test_unsupported_types_are_rejected() -> None:
    import pytest

    with pytest.raises(TypeError, match="set"):
        to_yaml({"a": {1, 2}})
    with pytest.raises(TypeError, match="keys must be strings"):
        to_yaml({1: "a"})


words = st.from_regex(r"[A-Za-z][A-Za-z0-9_./-]{0,12}", fullmatch=True)


@given(st.one_of(words, st.sampled_from([
    "yes", "Yes", "YES", "no", "NO", "true", "False", "on", "Off", "null", "Null", "NULL",
    "y", "Y", "n", "N", "nan", "inf", "a.b", "s3/x", "x-1", "e1", "E5", "x_", "a..", "a/"])))
@settings(max_examples=300, deadline=None)
def test_words_are_plain_exactly_when_pyyaml_reads_them_back_as_strings(word: str) -> None:
    """The emitter's shortcut for words (letters, digits, ``_ . / -``): written plain only
    when PyYAML's resolver gives a string, quoted (and still read back) otherwise."""
    text = to_yaml({"k": word})
    assert yaml.safe_load(text) == {"k": word}
    plain = text == f"k: {word}\n"
    assert plain == (yaml.safe_load(f"k: {word}\n") == {"k": word}), text
