"""Figures that work in Jupyter, in Colab and in the static HTML book.

Two kinds of interactivity, each used where it works:

* **altair** charts carry their data and their sliders inside the page (Vega-Lite parameters), so
  they stay interactive in the static book. They are emitted as ``text/html`` that loads vega from
  a CDN; the book's ``offline_js`` extension swaps those addresses for copies served by the book.
* **ipywidgets** controls call back into Python, so they are live in Jupyter and Colab only; the
  book shows their initial state.

Charts use the SVG renderer so that their marks are real DOM elements (the browser check counts
them).
"""

from __future__ import annotations

import ast
import inspect
import sys
import textwrap
from collections.abc import Sequence

import altair as alt
import torch
from IPython.display import Code

__all__ = ["configure", "glue", "glue_all", "heatmap", "long_form", "range_slider", "show_source",
           "slider_filter"]


# Text sizes that stay readable in the book's column (altair's defaults are 10 px and smaller).
_READABLE = {"labelFontSize": 12, "titleFontSize": 13}


@alt.theme.register("lecture", enable=False)
def _lecture_theme() -> alt.theme.ThemeConfig:
    return {"config": {"axis": _READABLE, "header": _READABLE, "legend": _READABLE,
                       "title": {"fontSize": 14}}}


def configure() -> None:
    """Set up altair (HTML output, SVG marks, readable text sizes, no row limit) and, in Colab,
    ipywidgets 8."""
    alt.renderers.enable("html", embed_options={"renderer": "svg", "actions": False})
    alt.theme.enable("lecture")
    alt.data_transformers.disable_max_rows()
    if "google.colab" in sys.modules:  # Colab needs this for ipywidgets >= 8 widgets to show
        from google.colab import output  # type: ignore[import-not-found]

        output.enable_custom_widget_manager()


def long_form(matrix: torch.Tensor, row: str = "query", col: str = "key", value: str = "weight",
              row_labels: Sequence[str] | None = None, col_labels: Sequence[str] | None = None,
              **constant: object) -> list[dict[str, object]]:
    """Turn a 2-D tensor into altair records ``{row: i, col: j, value: m[i, j], **constant}``.

    matrix: (rows, cols). Labels default to the indices. ``constant`` adds fixed fields, e.g. the
    slider value a matrix belongs to, so that several matrices can share one chart.
    """
    if matrix.dim() != 2:
        raise ValueError(f"matrix must be 2-D (rows, cols), got shape {tuple(matrix.shape)}")
    rows, cols = matrix.shape
    row_labels = list(row_labels) if row_labels is not None else list(range(rows))
    col_labels = list(col_labels) if col_labels is not None else list(range(cols))
    if len(row_labels) != rows or len(col_labels) != cols:
        raise ValueError(f"got {len(row_labels)} row and {len(col_labels)} column labels "
                         f"for a matrix of shape {tuple(matrix.shape)}")
    values = matrix.detach().double().cpu().tolist()
    return [{row: row_labels[i], col: col_labels[j], value: values[i][j], **constant}
            for i in range(rows) for j in range(cols)]


def heatmap(records: list[dict[str, object]], row: str = "query", col: str = "key",
            value: str = "weight", title: str = "") -> alt.Chart:
    """An attention-weight heatmap (rows = queries, columns = keys) from :func:`long_form` records.

    Labels keep the order in which they first appear in the records."""
    row_order = list(dict.fromkeys(r[row] for r in records))
    col_order = list(dict.fromkeys(r[col] for r in records))
    return (
        alt.Chart(alt.Data(values=records), title=title)
        .mark_rect()
        .encode(
            x=alt.X(f"{col}:O", sort=col_order, title=col),
            y=alt.Y(f"{row}:O", sort=row_order, title=row),
            color=alt.Color(f"{value}:Q", scale=alt.Scale(scheme="viridis"), title=value),
            tooltip=[f"{row}:O", f"{col}:O", alt.Tooltip(f"{value}:Q", format=".3f")],
        )
    )


def range_slider(name: str, values: Sequence[float], label: str | None = None) -> alt.Parameter:
    """A Vega-Lite slider over an evenly spaced grid ``values`` (the values data was computed for).

    Use it with ``chart.add_params(p).transform_filter(slider_filter(p, field, values))``; the
    chart then works in the static book because every slider position's data is in the page.
    """
    values = list(values)
    step = _grid_step(values)
    binding = alt.binding_range(min=values[0], max=values[-1], step=step, name=(label or name) + " ")
    return alt.param(name=name, value=values[len(values) // 2], bind=binding)


def slider_filter(param: alt.Parameter, field: str, values: Sequence[float]) -> str:
    """Vega expression keeping the rows whose ``field`` is the grid value the slider is on.

    Compared within half a step, because a slider's floats (0.1 + 0.2 ...) need not equal the
    grid's exactly."""
    return f"abs(datum['{field}'] - {param.name}) < {_grid_step(list(values)) / 2!r}"


def _grid_step(values: list[float]) -> float:
    if len(values) < 2:
        raise ValueError(f"values needs at least two grid points, got {len(values)}")
    step = values[1] - values[0]
    if step <= 0 or any(abs((b - a) - step) > 1e-9 * max(1.0, abs(step))
                        for a, b in zip(values, values[1:])):
        raise ValueError("values must be increasing and evenly spaced (a slider has one step)")
    return step


def show_source(obj: object, docstring: bool = True) -> Code:
    """Display the source of a package function or class in a notebook, so that the book shows
    the code it runs and the two can never drift apart. ``docstring=False`` leaves out its
    docstring (a method's source is then dedented), where the prose has just said the same."""
    source = inspect.getsource(obj)
    return Code(source if docstring else _without_docstring(source), language="python")


def _without_docstring(source: str) -> str:
    """``source`` of one def or class, dedented, without the docstring that opens its body."""
    source = textwrap.dedent(source)
    lines = source.splitlines(keepends=True)
    body = ast.parse(source).body[0].body
    first = body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
            and isinstance(first.value.value, str):
        del lines[first.lineno - 1:first.end_lineno]
    return "".join(lines)


# myst-nb reads glued values from outputs carrying this MIME prefix and a "scrapbook" record.
_GLUE_PREFIX = "application/papermill.record/"


def glue(name: str, value: object, display: bool = False) -> None:
    """Record ``value`` under ``name`` for the chapter's prose (``{glue:text}`name:.3f```), so that
    numbers in the text come from the computation.

    The same output myst-nb's ``glue`` writes, without needing myst-nb where a chapter runs (Colab):
    the value's display formats under a hidden MIME prefix, with ``metadata["scrapbook"]`` naming it.
    """
    from IPython.core.formatters import format_display_data
    from IPython.display import display as ipython_display

    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"name must be an identifier-like string, got {name!r}")
    bundle, metadata = format_display_data(value)
    prefix = "" if display else _GLUE_PREFIX
    metadata["scrapbook"] = {"name": name, "mime_prefix": prefix}
    ipython_display({prefix + mime: data for mime, data in bundle.items()}, raw=True, metadata=metadata)


def glue_all(**values: object) -> None:
    """``glue(name, value)`` for every keyword, none displayed: a cell's numbers for the prose in
    one call, ``glue_all(ratio=r, steps=n)``."""
    for name, value in values.items():
        glue(name, value)
