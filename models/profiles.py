"""Workload profiles: MiniBatchKMeans over per-request shape features.

A profile is a kind of request the fleet serves ("long prompt, short output", ...). The warm-up
planner keeps at least one representative request of each profile, so a freshly started replica
has run every shape it will see. Profiles are learned from records (:mod:`pipeline.records`):
the number of profiles is chosen by silhouette within a range, features are standardised, and
``partial_fit`` moves the centroids with new windows (the MiniBatchKMeans update), so a profile
keeps its label. A full refit matches new centroids to old ones, so labels stay stable too.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from scipy.optimize import linear_sum_assignment
from sklearn.cluster import MiniBatchKMeans
from sklearn.metrics import silhouette_score

from models.model_state import ModelState
from pipeline.errors import BadInputError, PrewarmError

PROFILE_FEATURES = (
    "log_prompt_tokens",
    "log_output_tokens",
    "log_output_over_prompt",
    "log_interarrival_s",
    "streaming",
    "chat_endpoint",
    "log_ttft_s",
    "log_e2e_s",
)
# Token-count thresholds of the plain descriptions (a 512-token prefix block is "short").
_PROMPT_WORDS = ((512, "short prompt"), (4096, "medium prompt"), (np.inf, "long prompt"))
_OUTPUT_WORDS = ((64, "short output"), (512, "medium output"), (np.inf, "long output"))


class ProfilerNotFittedError(PrewarmError):
    """The profiler was used before it was fitted."""


def request_features(records: pd.DataFrame) -> np.ndarray:
    """Per-request shape features (rows in ``records`` order; NaN where unknown)."""
    if records.empty:
        raise BadInputError("no requests to profile", where="records")
    prompt = _numeric(records, "prompt_tokens")
    output = _numeric(records, "output_tokens")
    ts = pd.to_datetime(records["ts"], utc=True) if "ts" in records else None
    return np.column_stack(
        [
            np.log1p(prompt),
            np.log1p(output),
            np.log1p(output) - np.log1p(prompt),
            np.log1p(_interarrival_s(ts, len(records))),
            _numeric(records, "stream"),
            _chat(records),
            np.log1p(_numeric(records, "ttft_s")),
            np.log1p(_numeric(records, "e2e_s")),
        ]
    )


def _numeric(records: pd.DataFrame, column: str) -> np.ndarray:
    if column not in records:
        return np.full(len(records), np.nan)
    return (
        pd.to_numeric(records[column], errors="coerce").astype("float64").to_numpy(na_value=np.nan)
    )


def _interarrival_s(ts: pd.Series | None, n: int) -> np.ndarray:
    """Seconds since the previous request (in time order); NaN for the first or without ts."""
    if ts is None:
        return np.full(n, np.nan)
    seconds_all = (ts - pd.Timestamp(0, tz="UTC")).dt.total_seconds().to_numpy(dtype=float)
    order = np.argsort(seconds_all, kind="stable")
    seconds = seconds_all[order]
    gaps = np.empty(n)
    gaps[order] = np.concatenate([[np.nan], np.diff(seconds)])
    return gaps


def _chat(records: pd.DataFrame) -> np.ndarray:
    if "endpoint" not in records:
        return np.full(len(records), np.nan)
    endpoint = records["endpoint"].astype("string")
    return np.where(endpoint.isna(), np.nan, endpoint.str.contains("chat").fillna(False))


class WorkloadProfiler:
    """MiniBatchKMeans workload profiles; their number is chosen in ``[min_, max_profiles]``.

    ``sample`` bounds the rows used to choose the count (silhouette is quadratic).
    """

    name = "profiles"

    def __init__(
        self,
        min_profiles: int = 2,
        max_profiles: int = 8,
        sample: int = 3000,
        batch_size: int = 1024,
        random_state: int = 0,
    ) -> None:
        self.min_profiles = min_profiles
        self.max_profiles = max_profiles
        self.sample = sample
        self.batch_size = batch_size
        self.random_state = random_state

    def fit(self, records: pd.DataFrame) -> WorkloadProfiler:
        """Learn scaling and profiles from ``records``; a refit keeps matching labels."""
        raw = request_features(records)
        self.fill_ = _column_fill(raw)
        filled = np.where(np.isnan(raw), self.fill_, raw)
        self.mean_ = filled.mean(axis=0)
        self.scale_ = np.where(filled.std(axis=0) > 1e-9, filled.std(axis=0), 1.0)
        scaled = (filled - self.mean_) / self.scale_
        centers = self._cluster(scaled)
        previous: np.ndarray | None = getattr(self, "centers_", None)
        if previous is not None:
            centers = _match(previous, centers)
        self.centers_ = centers
        self.counts_ = np.bincount(_nearest(scaled, centers), minlength=len(centers)).astype(float)
        return self

    def partial_fit(self, records: pd.DataFrame) -> WorkloadProfiler:
        """Move the centroids toward ``records`` (MiniBatchKMeans update); labels are kept."""
        if not hasattr(self, "centers_"):
            return self.fit(records)
        scaled = self._scaled(records)
        labels = _nearest(scaled, self.centers_)
        for k in np.unique(labels):
            members = scaled[labels == k]
            total = self.counts_[k] + len(members)
            self.centers_[k] += (members.sum(axis=0) - len(members) * self.centers_[k]) / total
            self.counts_[k] = total
        return self

    def predict(self, records: pd.DataFrame) -> np.ndarray:
        """The profile of each request."""
        return _nearest(self._scaled(records), self.centers_)

    @property
    def n_profiles_(self) -> int:
        self._check_fitted()
        return len(self.centers_)

    def describe(self) -> list[str]:
        """A plain description per profile, e.g. ``"long prompt, short output (~6,700 → ~20)"``."""
        centers = self.centers_ * self.scale_ + self.mean_
        return [_describe(np.expm1(c[0]), np.expm1(c[1])) for c in centers]

    def representatives(self, records: pd.DataFrame) -> pd.DataFrame:
        """One request per profile present in ``records`` (the closest to its centroid).

        Returns those rows of ``records`` with ``profile`` and ``description`` added.
        """
        scaled = self._scaled(records)
        labels = _nearest(scaled, self.centers_)
        distance = np.linalg.norm(scaled - self.centers_[labels], axis=1)
        frame = records.reset_index(drop=True).assign(profile=labels, _distance=distance)
        best = frame.sort_values("_distance", kind="stable").groupby("profile").head(1)
        descriptions = self.describe()
        best = best.assign(description=[descriptions[k] for k in best["profile"]])
        return best.drop(columns="_distance").sort_values("profile").reset_index(drop=True)

    def get_params(self) -> dict[str, Any]:
        """Constructor parameters."""
        return {k: v for k, v in vars(self).items() if not k.endswith("_")}

    def feature_names(self) -> list[str]:
        """The per-request features the profiles are defined on."""
        return list(PROFILE_FEATURES)

    def training_range(self) -> tuple[str | None, str | None]:
        """Not tracked for profiles (they follow the records they were given)."""
        return (None, None)

    def export_state(self) -> ModelState:
        """Arrays for :mod:`models.persistence`."""
        self._check_fitted()
        names = ("fill_", "mean_", "scale_", "centers_", "counts_")
        return ModelState(arrays={name.rstrip("_"): getattr(self, name) for name in names})

    def import_state(self, state: ModelState) -> WorkloadProfiler:
        """Restore arrays saved by :meth:`export_state`; returns ``self``."""
        for name, value in state.arrays.items():
            setattr(self, f"{name}_", np.asarray(value, dtype=float))
        return self

    def _scaled(self, records: pd.DataFrame) -> np.ndarray:
        self._check_fitted()
        raw = request_features(records)
        return (np.where(np.isnan(raw), self.fill_, raw) - self.mean_) / self.scale_

    def _check_fitted(self) -> None:
        if not hasattr(self, "centers_"):
            raise ProfilerNotFittedError("WorkloadProfiler must be fitted before use")

    def _cluster(self, scaled: np.ndarray) -> np.ndarray:
        rng = np.random.default_rng(self.random_state)
        pick = rng.choice(len(scaled), size=min(self.sample, len(scaled)), replace=False)
        upper = min(self.max_profiles, len(np.unique(scaled[pick], axis=0)) - 1)
        if upper < self.min_profiles:
            return self._kmeans(max(1, upper)).fit(scaled).cluster_centers_
        scores = {}
        for k in range(self.min_profiles, upper + 1):
            labels = self._kmeans(k).fit_predict(scaled[pick])
            scores[k] = silhouette_score(scaled[pick], labels) if len(set(labels)) > 1 else -1
        best = max(scores, key=lambda k: scores[k])
        return self._kmeans(best).fit(scaled).cluster_centers_

    def _kmeans(self, k: int) -> MiniBatchKMeans:
        return MiniBatchKMeans(
            n_clusters=k, batch_size=self.batch_size, n_init=3, random_state=self.random_state
        )


def _column_fill(raw: np.ndarray) -> np.ndarray:
    """Median per feature; 0 for a feature the records never carry."""
    with np.errstate(all="ignore"):
        known = np.isfinite(raw).any(axis=0)
        medians = np.nanmedian(np.where(np.isfinite(raw), raw, np.nan)[:, known], axis=0)
    fill = np.zeros(raw.shape[1])
    fill[known] = medians
    return fill


def _nearest(points: np.ndarray, centers: np.ndarray) -> np.ndarray:
    distances = ((points[:, None, :] - centers[None, :, :]) ** 2).sum(axis=2)
    return distances.argmin(axis=1)


def _match(old: np.ndarray, new: np.ndarray) -> np.ndarray:
    """Reorder ``new`` centroids so each takes the label of the closest old one."""
    cost = np.linalg.norm(old[:, None, :] - new[None, :, :], axis=2)
    rows, cols = linear_sum_assignment(cost)
    order = [cols[np.argsort(rows)][i] for i in range(len(rows))]
    rest = [j for j in range(len(new)) if j not in set(cols)]
    return new[order + rest]


def _describe(prompt_tokens: float, output_tokens: float) -> str:
    prompt = next(word for limit, word in _PROMPT_WORDS if prompt_tokens < limit)
    output = next(word for limit, word in _OUTPUT_WORDS if output_tokens < limit)
    return f"{prompt}, {output} (~{prompt_tokens:,.0f} → ~{output_tokens:,.0f} tokens)"
