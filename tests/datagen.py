"""The tests' generated datasets: :mod:`tools.datagen`, where ``make demo`` runs it from (it
moved there so that no make target imports from ``tests/``). The tests keep importing it as
``tests.datagen``."""
from tools.datagen import (class_color, label_from_pixels, make_dataset, make_image,  # noqa: F401
                           make_split)
