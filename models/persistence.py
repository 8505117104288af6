"""Versioned, atomic model storage with metadata; nothing is pickled.

Layout under a models root::

    <root>/<name>/v0001/metadata.json   kind, params, library versions, feature names,
                        state.json      training range, code version
                        arrays.npz      (numpy arrays, loaded with allow_pickle=False)
                        booster.txt     (LightGBM's own text format, and other text parts)
    <root>/<name>/current               the name of the version in use ("v0001")

A version is written in a temporary folder and renamed into place (``os.replace``), and the
``current`` pointer is replaced the same way, so a reader sees a whole old version or a whole new
one, never a half-written file. Loading checks the metadata against the running code: a model
built for another feature set, code version or library major version is refused with
:class:`ModelMismatchError` naming what differs.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from models.model_state import ModelState
from pipeline.errors import BadInputError

#: Bump when a saved file's layout or meaning changes; older saves are then refused.
SCHEMA_VERSION = 1
_VERSION = re.compile(r"^v(\d{4,})$")
#: Libraries whose major.minor must match between save and load (their formats drift).
CHECKED_LIBRARIES = ("numpy", "scikit-learn", "lightgbm")


class ModelMismatchError(BadInputError):
    """A saved model does not fit the running code (kind, features, versions)."""


class PersistableModel(Protocol):
    """A model the store can save: its kind, parameters, features and state."""

    @property
    def name(self) -> str: ...

    def get_params(self) -> dict[str, Any]: ...

    def export_state(self) -> ModelState: ...

    def training_range(self) -> tuple[str | None, str | None]: ...

    def feature_names(self) -> list[str]: ...


def code_version() -> str:
    """Version of the running prewarm code, as recorded with every saved model."""
    try:
        release = importlib_metadata.version("prewarm")
    except importlib_metadata.PackageNotFoundError:
        release = "0+unknown"
    return f"{release}/schema-{SCHEMA_VERSION}"


def library_versions() -> dict[str, str]:
    """Versions of the libraries a saved model depends on."""
    versions = {"python": platform.python_version()}
    for name in CHECKED_LIBRARIES:
        try:
            versions[name] = importlib_metadata.version(name)
        except importlib_metadata.PackageNotFoundError:
            versions[name] = "absent"
    return versions


def save_model(
    model: PersistableModel, root: str | Path, name: str, extra: dict[str, Any] | None = None
) -> Path:
    """Save ``model`` as the next version of ``name`` under ``root`` and make it current.

    ``extra`` (JSON values, e.g. which data it was trained on) is kept in the metadata.
    """
    home = Path(root) / name
    home.mkdir(parents=True, exist_ok=True)
    state = model.export_state()
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=home))
    try:
        _write_state(staging, state)
        _write_json(staging / "metadata.json", {**_metadata(model, state), "extra": extra or {}})
        target = _claim_version(home, staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    _replace_text(home / "current", target.name)
    return target


def _metadata(model: PersistableModel, state: ModelState) -> dict[str, Any]:
    start, end = model.training_range()
    return {
        "kind": model.name,
        "params": model.get_params(),
        "schema_version": SCHEMA_VERSION,
        "code_version": code_version(),
        "libraries": library_versions(),
        "feature_names": model.feature_names(),
        "training_range": {"from": start, "until": end},
        "saved_at": datetime.now(UTC).isoformat(),
        "arrays": sorted(state.arrays),
        "texts": sorted(state.texts),
    }


def _write_state(folder: Path, state: ModelState) -> None:
    _write_json(folder / "state.json", state.values)
    if state.arrays:
        with (folder / "arrays.npz").open("wb") as handle:
            np.savez(handle, allow_pickle=False, **state.arrays)
    for part, text in state.texts.items():
        (folder / f"{part}.txt").write_text(text, encoding="utf-8")


def _write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2, sort_keys=True, default=str), encoding="utf-8")


def _claim_version(home: Path, staging: Path) -> Path:
    """Rename ``staging`` to the next free version name (retrying if another writer won)."""
    while True:
        target = home / f"v{max(list_versions(home), default=0) + 1:04d}"
        try:
            os.rename(staging, target)  # fails if target exists: no silent overwrite
            return target
        except OSError:
            if not target.exists():
                raise


def _replace_text(path: Path, text: str) -> None:
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temp, path)


def list_versions(home: str | Path) -> list[int]:
    """Version numbers saved under a model's folder, ascending."""
    folder = Path(home)
    if not folder.is_dir():
        return []
    found = (_VERSION.match(child.name) for child in folder.iterdir())
    return sorted(int(match.group(1)) for match in found if match)


def current_version(root: str | Path, name: str) -> str:
    """Name of the current version of ``name`` (e.g. ``v0003``)."""
    pointer = Path(root) / name / "current"
    if not pointer.is_file():
        raise BadInputError("no saved model (no current pointer)", where=str(pointer))
    return pointer.read_text(encoding="utf-8").strip()


@dataclass(frozen=True)
class LoadedModel:
    """A saved model's parts as read back, before the model class rebuilds itself."""

    path: Path
    metadata: dict[str, Any]
    state: ModelState


def read_saved(root: str | Path, name: str, version: str | None = None) -> LoadedModel:
    """Read the parts of a saved version (default: current); checks nothing about the code."""
    folder = Path(root) / name / (version or current_version(root, name))
    meta_path = folder / "metadata.json"
    if not meta_path.is_file():
        raise BadInputError("not a saved model (no metadata.json)", where=str(folder))
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    values = json.loads((folder / "state.json").read_text(encoding="utf-8"))
    arrays: dict[str, np.ndarray] = {}
    if meta.get("arrays"):
        with np.load(folder / "arrays.npz", allow_pickle=False) as bundle:
            arrays = {key: bundle[key] for key in bundle.files}
    texts = {part: (folder / f"{part}.txt").read_text("utf-8") for part in meta.get("texts", [])}
    return LoadedModel(folder, meta, ModelState(values, arrays, texts))


def check_compatible(saved: LoadedModel, kind: str, feature_names: list[str]) -> None:
    """Refuse a saved model that the running code cannot use as it was trained."""
    meta, where = saved.metadata, str(saved.path / "metadata.json")
    _same("kind", meta.get("kind"), kind, where)
    _same("schema_version", meta.get("schema_version"), SCHEMA_VERSION, where)
    _same("code_version", meta.get("code_version"), code_version(), where)
    _same("feature_names", meta.get("feature_names"), feature_names, where)
    running = library_versions()
    for library in CHECKED_LIBRARIES:
        saved_version = meta.get("libraries", {}).get(library, "absent")
        _same(
            f"{library} version", _major_minor(saved_version), _major_minor(running[library]), where
        )


def _same(what: str, saved: Any, running: Any, where: str) -> None:
    if saved != running:
        raise ModelMismatchError(
            f"saved model's {what} is {_short(saved)}, running code has {_short(running)}; "
            "retrain the model (prewarm.model.retrain)",
            where=where,
        )


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 120 else text[:117] + "..."


def _major_minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def model_classes() -> dict[str, type]:
    """Saved kinds and the classes that rebuild them."""
    # Imported here, not at the top: the forecaster loads LightGBM (seconds), needed only
    # when a saved model is loaded.
    from models.baselines import (
        EWMA,
        DailyBlend,
        FrequencyEstimate,
        LastWindow,
        MovingAverage,
        RecencyBlend,
        SeasonalNaive,
    )
    from models.forecaster import HotnessForecaster
    from models.profiles import WorkloadProfiler
    from models.tiered import TieredRanking
    from models.topics import TopicModel

    classes = (LastWindow, MovingAverage, EWMA, FrequencyEstimate, SeasonalNaive, RecencyBlend,
               DailyBlend, TieredRanking, HotnessForecaster, WorkloadProfiler,
               TopicModel)  # fmt: skip
    return {cls.name: cls for cls in classes}


def load_model(
    root: str | Path, name: str, version: str | None = None, kind: str | None = None
) -> Any:
    """Load a saved model (default: the current version), refusing one the code cannot use.

    ``kind`` (e.g. ``"lightgbm"``) makes loading a different kind of model an error too.
    """
    saved = read_saved(root, name, version)
    saved_kind = str(saved.metadata.get("kind"))
    where = str(saved.path / "metadata.json")
    if kind is not None:
        _same("kind", saved_kind, kind, where)
    cls = model_classes().get(saved_kind)
    if cls is None:
        raise ModelMismatchError(f"unknown model kind {saved_kind!r}", where=where)
    model = cls(**saved.metadata.get("params", {}))
    check_compatible(saved, saved_kind, model.feature_names())
    return model.import_state(saved.state)
