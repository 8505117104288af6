"""What a model exports to be saved (:mod:`models.persistence` writes it, the models fill it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class ModelState:
    """What a model exports to be saved: JSON values, numpy arrays and text parts."""

    values: dict[str, Any] = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)
