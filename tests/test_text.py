"""Plain-text tables fit JupyterLab's default width by narrowing their widest columns."""

from fusionlab.text import MAX_WIDTH, clip, text_table


def test_table_aligns_columns():
    lines = text_table(["a", "bb"], [["1", "2"], ["333", "4"]])
    assert lines == ["a    bb", "---  --", "1    2", "333  4"]


def test_wide_table_is_narrowed_to_max_width_longest_column_first():
    long = "Conv+BatchNormalization+Add+Relu+Sigmoid+Mul" * 3
    lines = text_table(["id", "pattern", "lowered to"], [["v0", long, "com.microsoft:FusedConv"]])
    assert max(map(len, lines)) <= MAX_WIDTH
    assert lines[2].startswith("v0  Conv+BatchNormalization") and "…" in lines[2]
    assert lines[2].rstrip().endswith("com.microsoft:FusedConv")  # the shorter column kept whole


def test_no_limit_keeps_cells_whole():
    long = "x" * 200
    assert text_table(["h"], [[long]], max_width=None)[2] == long


def test_headers_are_never_clipped():
    header = [f"column {i}" for i in range(14)]
    lines = text_table(header, [["y" * 20] * 14])
    assert lines[0].split("  ")[0] == "column 0" and "column 13" in lines[0]


def test_clip():
    assert clip("abcdef", 4) == "abc…" and clip("abc", 4) == "abc"


def test_long_headers_go_over_two_lines_before_cells_are_clipped():
    header = ["pattern", "launches saved", "saved KiB"]
    lines = text_table(header, [["Conv+BatchNormalization+Relu" * 3, "2", "4.0"]], max_width=102)
    assert lines[0].split() == ["pattern", "launches", "saved"] and lines[1].split() == ["saved", "KiB"]
    assert "Conv+BatchNormalization+Relu" * 3 in lines[3]  # it fits once the headers are narrower


def test_wrap_breaks_only_long_lines():
    from fusionlab.text import wrap

    text = "short line\n" + " ".join(["word"] * 40)
    lines = wrap(text, 50).split("\n")
    assert lines[0] == "short line" and all(len(l) <= 50 for l in lines)
    assert all(l.startswith("    word") for l in lines[2:]) and " ".join(lines[1:]).split() == ["word"] * 40
