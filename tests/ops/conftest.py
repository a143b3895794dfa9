"""The image batches every image operator is checked on."""

from __future__ import annotations

import numpy as np
import pytest

from ops.references import BATCHES, batch_of


@pytest.fixture(scope="module", params=BATCHES)
def nhwc(request) -> np.ndarray:
    return batch_of(request.param)
