"""Where the repository and the real ImageNet sample are."""
from __future__ import annotations

import os

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The real 250-image sample beside the checkout (IMAGENET_SAMPLE to read it from elsewhere).
SAMPLE = os.environ.get("IMAGENET_SAMPLE",
                        os.path.join(REPO, "..", "shared", "data", "imagenet-sample"))
