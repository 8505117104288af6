"""Topic drift, per engine: what users ask about, window by window, against the windows before.

Each window tick hands the records it read to :meth:`TopicWatch.observe`: a sample of each
window's prompts (``topics.sample_per_window``, chosen by prompt hash, so a rerun samples the
same) is embedded with all-MiniLM-L6-v2 (in batches, cached by prompt hash in the worker
process), assigned to the engine's topics (a :class:`models.topics.TopicModel`: MiniBatchKMeans
fitted on the first sample, saved under ``<data_dir>/models/<engine>/topics``) and the window's
mix is added to the engine's topic history (:mod:`tasks.adapters.topic_history`).
:meth:`TopicWatch.event` judges the newest closed window against its baseline
(:func:`pipeline.topic_drift.topic_drift_event`); the loop passes the event through its cooldown
and answers it (:meth:`tasks.services.loop.WarmLoop.topic_drift`). After a drift the topics are
fitted again on the drifted window's sample, and the history starts over with them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from models.persistence import ModelMismatchError, load_model, save_model
from models.topics import PromptEmbedder, TopicModel, prompt_hash
from pipeline.topic_drift import TopicDriftRule, topic_drift_event
from pipeline.triggers import TriggerEvent
from tasks.adapters.embedder import shared_embedder
from tasks.adapters.observations import models_root
from tasks.adapters.topic_history import TopicHistory
from tasks.settings import Settings

log = logging.getLogger(__name__)

#: Where an engine's topic model is saved under its models root.
TOPICS_NAME = "topics"


def window_samples(records: pd.DataFrame, window_s: int, per_window: int) -> dict[float, list[str]]:
    """Up to ``per_window`` prompts of each window of ``records`` (window start in Unix
    seconds), the same ones whoever samples: the lowest prompt hashes."""
    if records.empty or "prompt" not in records.columns:
        return {}
    rows = records[records["prompt"].notna() & records["ts"].notna()]
    if rows.empty:
        return {}
    epoch = pd.Timestamp(0, tz="UTC")
    seconds = (pd.to_datetime(rows["ts"], utc=True) - epoch).dt.total_seconds()
    frame = pd.DataFrame({
        "window": (seconds // window_s * window_s).to_numpy(dtype=float),
        "prompt": rows["prompt"].astype(str).to_numpy(),
    })  # fmt: skip
    frame["rank"] = [prompt_hash(p) for p in frame["prompt"]]
    frame = frame.sort_values(["window", "rank"], kind="stable")
    return {float(w): list(g["prompt"].head(per_window)) for w, g in frame.groupby("window")}


class TopicWatch:
    """One engine's topics: observe windows, judge the newest, fit again after a drift."""

    def __init__(
        self,
        settings: Settings,
        engine: str,
        embedder: Callable[[], PromptEmbedder] = shared_embedder,
        root: Path | None = None,
    ) -> None:
        self.settings = settings
        self.engine = engine
        self.embedder = embedder
        # the models folder of this step (a bucket's is checked out by the caller)
        self.root = root if root is not None else models_root(settings.data_dir, engine)
        self.history = TopicHistory(settings.data_dir, engine)
        topics = settings.topics
        self.rule = TopicDriftRule(baseline_windows=topics.baseline_windows)

    def observe(self, records: pd.DataFrame) -> int:
        """Add the topic mix of each window of ``records`` to the history; the prompts
        sampled."""
        window_s = self.settings.schedule.window_s
        samples = window_samples(records, window_s, self.settings.topics.sample_per_window)
        if not samples:
            return 0
        embedder = self.embedder()
        vectors = {w: embedder.embed(prompts) for w, prompts in samples.items()}
        model = self._model(np.concatenate(list(vectors.values())))
        self.history.append({w: model.mix(v) for w, v in vectors.items()},
                            self.settings.loop.keep_windows)  # fmt: skip
        return sum(len(p) for p in samples.values())

    def event(self, closed_before: float) -> TriggerEvent | None:
        """``topic_drift`` when the last window closed before ``closed_before`` moved away
        from its baseline (an older drift found late is history, not an event)."""
        mixes = [m for m in self.history.mixes() if m[0] < closed_before]
        event = topic_drift_event(self.engine, mixes, self.rule)
        window_s = self.settings.schedule.window_s
        if event is None or event.ts < closed_before - 2 * window_s:
            return None
        return event

    def refit(self, records: pd.DataFrame | None, window: float) -> None:
        """Fit the topics again on ``window``'s sample of ``records`` and start the history
        over: mixes counted in the old topics cannot be compared with the new ones."""
        if records is None:
            return
        window_s = self.settings.schedule.window_s
        samples = window_samples(records, window_s, self.settings.topics.sample_per_window)
        if window not in samples:
            return
        vectors = self.embedder().embed(samples[window])
        self._save(TopicModel(n_topics=self.settings.topics.n_topics).fit(vectors))
        self.history.clear()

    def _model(self, first: np.ndarray) -> TopicModel:
        """The engine's saved topics, else ones fitted on ``first`` and saved."""
        if (self.root / TOPICS_NAME / "current").exists():
            try:
                model: TopicModel = load_model(self.root, TOPICS_NAME, kind=TopicModel.name)
                return model
            except ModelMismatchError as exc:  # saved by other code: fitted again, as new
                log.info("engine %s: topics fitted again (%s)", self.engine, exc)
                self.history.clear()
        model = TopicModel(n_topics=self.settings.topics.n_topics).fit(first)
        self._save(model)
        return model

    def _save(self, model: TopicModel) -> None:
        path = save_model(model, self.root, TOPICS_NAME, extra={"engine": self.engine})
        log.info("engine %s: %d topics saved (%s)", self.engine, model.n_topics_, path.name)
