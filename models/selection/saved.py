"""The saved winner: its selection report in the model's metadata, and reading both back (what
the planner and ``prewarm status`` use)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from models.baselines import HotnessModel
from models.persistence import load_model, read_saved
from models.selection.forecaster import SelectedForecaster
from pipeline.errors import BadInputError

#: The metadata key (under ``extra``) of a saved model's selection report.
SELECTION_KEY = "selection"


def selection_metadata(selected: SelectedForecaster) -> dict[str, Any]:
    """The ``extra`` metadata to save the winner with (``save_model(..., extra=...)``)."""
    return {SELECTION_KEY: selected.report()}


@dataclass(frozen=True)
class SavedForecaster:
    """A saved hotness model as loaded: the model, and its selection report if it has one."""

    model: HotnessModel
    version: str
    selection: dict[str, Any] | None

    @property
    def winner(self) -> str | None:
        """The candidate name that won the backtest (``None``: saved without selection)."""
        return None if self.selection is None else str(self.selection["winner"])


def load_selected(root: str | Path, name: str) -> SavedForecaster:
    """Load the current saved hotness model (whatever kind won) and its selection report."""
    saved = read_saved(root, name)
    model = load_model(root, name, version=saved.path.name)
    if not isinstance(model, HotnessModel):
        raise BadInputError(f"{saved.metadata.get('kind')!r} is not a hotness model",
                            where=str(saved.path / "metadata.json"))  # fmt: skip
    selection = saved.metadata.get("extra", {}).get(SELECTION_KEY)
    return SavedForecaster(model, saved.path.name, selection)


def saved_selection(root: str | Path, name: str) -> dict[str, Any] | None:
    """What ``prewarm status`` shows of the saved hotness model: its version, kind, winner and
    backtest table (``None`` when nothing is saved)."""
    try:
        saved = read_saved(root, name)
    except BadInputError:
        return None
    selection = saved.metadata.get("extra", {}).get(SELECTION_KEY) or {}
    return {
        "version": saved.path.name,
        "kind": saved.metadata.get("kind"),
        "trained_until": saved.metadata.get("training_range", {}).get("until"),
        "winner": selection.get("winner", saved.metadata.get("kind")),
        "note": selection.get("note"),
        "table": selection.get("table", []),
    }


def winner_table(report: dict[str, Any]) -> pd.DataFrame:
    """A selection report's backtest table, best share first."""
    table = pd.DataFrame(report.get("table", []), columns=["model", "kind", "share", "mae"])
    return table.sort_values(["share", "mae"], ascending=[False, True]).reset_index(drop=True)
