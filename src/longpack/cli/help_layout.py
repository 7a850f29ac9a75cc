"""``--help`` that never cuts an option name or a choice: typer's option panel, laid out to fit.

typer (0.29, ``typer/rich_utils.py``, ``_print_options_panel``) lays each option panel out as a rich table of
seven columns (required, long names, short names, negative long names, negative short names, type, help) whose
cells rich truncates with an ellipsis when the terminal is narrow: at 80 columns ``longpack pack --help`` printed
25 cut cells (``--pad-seq-to-mu…``, ``best_fit_decrea…``). This panel keeps typer's look (the same highlighters,
styles and help text) with four columns sized so that nothing is lost: the option names (``--flag / --no-flag``)
never wrap, the type column is at most a fifth of the width and folds a long choice list, and the help column
takes the rest and wraps at words (a word longer than the column folds: nothing is ever replaced by ``…``).

>>> from typer.testing import CliRunner
>>> from longpack.cli.app import app
>>> text = CliRunner().invoke(app, ["pack", "--help"], terminal_width=80).output
>>> "…" in text, "--pad-seq-to-mult" in text
(False, True)
"""

from __future__ import annotations

from typing import Any

import typer.rich_utils as typer_rich
from rich import box
from rich.panel import Panel
from rich.table import Table
from rich.text import Text
from typer.core import TyperArgument, TyperOption

#: The widest the type column gets, as a share of the console width (a long choice list folds inside it).
TYPE_COLUMN_SHARE = 0.2


def _names(param: TyperOption | TyperArgument) -> tuple[str, str]:
    """``(names, negative names)`` as typer shows them: ``--out``, ``--sp / --no-sp``, ``[INPUT]...``."""
    display = None
    if isinstance(param, TyperArgument):
        display = param.display_name_raw
        if param.metavar is None and param.nargs != 1:
            display += "..."
    names = [s for s in param.opts if "--" in s] + [display or s for s in param.opts if "--" not in s]
    negative = [s for s in param.secondary_opts if "--" in s] + [
        s for s in param.secondary_opts if "--" not in s
    ]
    return ",".join(names), ",".join(negative)


def print_options_panel(
    *,
    name: str,
    params: list[TyperOption] | list[TyperArgument],
    ctx: Any,
    markup_mode: Any,
    console: Any,
) -> None:
    """typer's ``_print_options_panel`` with columns that fit (same arguments)."""
    if not params:
        return
    rows = []
    for param in params:
        names, negative = _names(param)
        label = typer_rich.highlighter(names)
        if negative:
            label.append(" / ")
            label.append_text(typer_rich.negative_highlighter(negative))
        label.overflow = "fold"  # only past the whole width: fold, never cut
        types = Text(style=typer_rich.STYLE_TYPES, overflow="fold")
        shown = param.display_type_rich(ctx=ctx)
        if shown is not None:
            types.append(shown)
        number_range = param._get_number_range_help_str()
        if number_range:
            types.append(typer_rich.RANGE_STRING.format(number_range))
        required = Text(typer_rich.REQUIRED_SHORT_STRING, style=typer_rich.STYLE_REQUIRED_SHORT)
        help_text = typer_rich._get_parameter_help(param=param, ctx=ctx, markup_mode=markup_mode)
        for item in help_text.renderables:  # rich.columns.Columns of Text: fold a long word, never cut it
            if isinstance(item, Text):
                item.overflow = "fold"
        rows.append(
            (required if param.required else Text(""), label, typer_rich.types_highlighter(types), help_text)
        )
    table = Table(
        highlight=True,
        show_header=False,
        expand=True,
        box=getattr(box, typer_rich.STYLE_OPTIONS_TABLE_BOX, None),
        show_lines=typer_rich.STYLE_OPTIONS_TABLE_SHOW_LINES,
        leading=typer_rich.STYLE_OPTIONS_TABLE_LEADING,
        pad_edge=typer_rich.STYLE_OPTIONS_TABLE_PAD_EDGE,
        padding=typer_rich.STYLE_OPTIONS_TABLE_PADDING,
        row_styles=typer_rich.STYLE_OPTIONS_TABLE_ROW_STYLES,
        border_style=typer_rich.STYLE_OPTIONS_TABLE_BORDER_STYLE,
    )
    table.add_column(no_wrap=True, overflow="fold")
    table.add_column(no_wrap=True, overflow="fold")
    table.add_column(overflow="fold", max_width=max(12, int(console.width * TYPE_COLUMN_SHARE)))
    table.add_column(overflow="fold", ratio=1)
    for row in rows:
        table.add_row(*row)
    console.print(
        Panel(
            table,
            border_style=typer_rich.STYLE_OPTIONS_PANEL_BORDER,
            title=name,
            title_align=typer_rich.ALIGN_OPTIONS_PANEL,
        )
    )


def install() -> None:
    """Use :func:`print_options_panel` for every ``--help`` (typer looks the function up at each call)."""
    typer_rich._print_options_panel = print_options_panel  # type: ignore[assignment]
