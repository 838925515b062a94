"""Layout of the HTML report that a browser need not check: column labels and the classes that
decide what wraps (issue 32). The page-width check itself is the browser test
``test_the_page_never_scrolls_sideways``."""

from __future__ import annotations

from advisor.render import html


def test_a_time_column_beside_its_namesake_says_time() -> None:
    """CLU003's top rows hold ``step`` and ``step_us``: the header read "step | step"."""
    assert html.evidence_labels(["rank", "step", "step_us", "excess_us"]) == {
        "rank": "rank", "step": "step", "step_us": "step time", "excess_us": "excess"}
    assert html.evidence_labels(["total_us", "count"]) == {"total_us": "total", "count": "count"}
    view = html.finding_view({"top": [{"rank": 1, "step": 2, "step_us": 10.0}], "evidence": {}}, None)
    assert view["top_labels"] == ["rank", "step", "step time"]


def test_text_evidence_wraps_and_numbers_do_not() -> None:
    view = html.finding_view({"evidence": {"slow_steps_extra": "aten::mm 5.7 ms per slow step " * 10,
                                           "total_us": 12.5, "flag": True}}, None)
    cls = {r["key"]: r["cls"] for r in view["measured"]}
    assert cls == {"slow_steps_extra": "text", "total_us": "num", "flag": "text"}


# -- demangled kernel names and the "What makes steps vary" table -----------------------------------

#: a demangled CUDA kernel name as long as those of real embedding kernels (over 1,000 characters)
KERNEL = ("void split_embedding_backward_codegen_kernel<float, float, int, " + ", ".join(["at::Half"] * 60)
          + ">(at::GenericPackedTensorAccessor<float, 1ul, at::RestrictPtrTraits, long>, "
          + ", ".join(f"int arg{i}" for i in range(60)) + ")")


def variability_report(shares: bool, steps: int = 6) -> dict:
    """A JSON report whose variability section lists :data:`KERNEL` first (with estimated shares or,
    as with too few steps, without)."""
    from tests.test_render_hostile import hostile_report

    d = hostile_report()
    ops = []
    for i, name in enumerate([KERNEL, "aten::mm", "nccl:all_reduce"]):
        op = {"name": name, "kind": "kernel", "p5_us": 1.0, "p50_us": 100.0 + i, "p95_us": 150.0, "sigma_us": 20.0,
              "temporal_sigma_us": 20.0, "spatial_sigma_us": 0.0}
        if shares:
            op["series_share"] = 0.5 / (i + 1)
        ops.append(op)
    d["variability"] = {"ranks": 1, "steps": steps, "assumption": "x",
                        "step_time": {"p5_us": 900.0, "p50_us": 1000.0, "p95_us": 1200.0, "sigma_us": 50.0,
                                      "n": steps},
                        "ops": ops}
    return d


def test_short_name_drops_template_arguments_first() -> None:
    from advisor.render.view import short_name

    assert len(KERNEL) > 1000
    assert short_name(KERNEL) == "void split_embedding_backward_codegen_kernel<…>(…)"
    assert short_name("aten::mm") == "aten::mm"
    assert short_name("a" * 200, 20) == "a" * 19 + "…"
    assert short_name("operator< " + "b" * 200, 20) == "operator< " + "b" * 9 + "…"  # unpaired: cut only


def test_variance_table_shortens_names_and_keeps_the_full_one_on_hover() -> None:
    from advisor.render import html, markdown, terminal

    d = variability_report(shares=True)
    page = html.render(d)
    section = page[page.index('<section id="variability">'):]
    assert "What makes steps vary" in section
    assert f'title="{KERNEL}"' in section.replace("&lt;", "<").replace("&gt;", ">")
    assert "split_embedding_backward_codegen_kernel&lt;…&gt;(…)</td>" in section.replace(
        '<span class="muted">', "")
    assert KERNEL[:200] not in markdown.render(d)
    text = terminal.render_text(d, width=80)
    var = text[text.index("Variability"):text.index("Confidence")]
    assert "split_embedding_backward_codegen_kernel<…>(…)" in var
    assert all(len(line) <= 80 for line in var.splitlines())
    assert len(var.splitlines()) <= 16, var  # the kernel takes a line or two, not one word per line
    wide = terminal.render_text(d, width=120)
    var = wide[wide.index("Variability"):wide.index("Confidence")]
    assert "share of variance" in var and "50 %" in var  # the table, no column cut


def test_variance_table_is_left_out_without_shares() -> None:
    from advisor.render import html, markdown, terminal

    d = variability_report(shares=False, steps=2)
    for text in (html.render(d), markdown.render(d), terminal.render_text(d, width=120)):
        assert "What makes steps vary" not in text and "share of variance" not in text
