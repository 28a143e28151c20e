"""A generated stand-in for the real ImageNet sample, for the tests that need JPEGs in its layout
but not real photographs (a clone has no ``../shared``): :func:`write_standin`.

Its 64 classes carry real WNIDs and names (every fourth class of the sample, ``tench`` first),
one picture each, ``train/<wnid>/<wnid>_<name>.JPEG``, and ``val/`` holds the same files, as the
sample's does. The pictures mimic what the sample's 250 JPEGs hold (measured with PIL): mostly
4:4:4 chroma (185 of 250), then 4:2:0 (60), one 4:2:2, a few grayscale; baseline, quality 85-98;
sides from 106 to 1,600 px, about 11% above 512 px and 6% at most 256 px. Each is smooth
colour gradients with soft-edged shapes and a little noise (so crops at different places or
scales differ, and chroma upsampling has edges to get wrong), drawn from a seeded generator:
the same files, byte for byte, on the same Pillow and libjpeg.
"""
from __future__ import annotations

import os

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

CLASSES = (
    "n01440764_tench n01560419_bulbul n01644900_tailed_frog n01695060_Komodo_dragon "
    "n01749939_green_mamba n01795545_black_grouse n01843383_toucan n01943899_conch "
    "n02002724_black_stork n02051845_pelican n02088094_Afghan_hound n02091831_Saluki "
    "n02096177_cairn n02099712_Labrador_retriever n02105056_groenendael n02107908_Appenzeller "
    "n02111277_Newfoundland n02114855_coyote n02128385_leopard n02169497_leaf_beetle "
    "n02268853_damselfly n02361337_marmot n02422699_impala n02483362_gibbon n02500267_indri "
    "n02669723_academic_gown n02777292_balance_beam n02804610_bassoon n02843684_birdhouse "
    "n02910353_buckle n02977058_cash_machine n03026506_Christmas_stocking n03109150_corkscrew "
    "n03187595_dial_telephone n03259280_Dutch_oven n03379051_football_helmet n03447447_gondola "
    "n03492542_hard_disc n03594734_jean n03661043_library n03717622_manhole_cover "
    "n03770679_minivan n03792972_mountain_tent n03857828_oscilloscope n03891332_parking_meter "
    "n03937543_pill_bottle n03982430_pool_table n04039381_racket n04118538_rugby_ball "
    "n04154565_screwdriver n04243546_slot n04277352_spindle n04346328_stupa "
    "n04392985_tape_player n04461696_tow_truck n04509417_unicycle n04553703_washbasin "
    "n04604644_worm_fence n07614500_ice_cream n07718747_artichoke n07836838_chocolate_sauce "
    "n09399592_promontory n12998815_agaric n13052670_hen-of-the-woods").split()
# (width, height) of a few pictures by index, as the sample's extremes; the rest are drawn.
FIXED_SIZES = {3: (106, 150), 8: (640, 480), 17: (1200, 1600), 23: (1000, 750),
               29: (1024, 768), 41: (909, 768), 45: (256, 192), 50: (135, 97), 60: (800, 600)}
GRAYSCALE = (11, 37)
SUBSAMPLING = {5: 1, **{i: 2 for i in range(0, 64, 5) if i != 5}}  # the rest 0 (4:4:4)


def picture(rng: np.random.Generator, width: int, height: int) -> Image.Image:
    """An RGB picture: a gradient between random colours, soft ellipses and rectangles on it,
    noise of a few levels."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    start, across, down = rng.uniform(0, 255, size=(3, 3)).astype(np.float32)
    pixels = (start + (x / width)[..., None] * (across - start)
              + (y / height)[..., None] * (down - start))
    image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(image)
    for _ in range(int(rng.integers(3, 9))):
        x0, y0 = int(rng.integers(0, width)), int(rng.integers(0, height))
        box = (x0, y0, x0 + int(rng.integers(4, width // 2 + 5)),
               y0 + int(rng.integers(4, height // 2 + 5)))
        fill = tuple(int(v) for v in rng.integers(0, 256, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(box, fill=fill)
    image = image.filter(ImageFilter.GaussianBlur(float(rng.uniform(0.5, 2.0))))
    noisy = np.asarray(image, dtype=np.float32) + rng.normal(0, 4, (height, width, 3))
    return Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8), "RGB")


def size_of(index: int, rng: np.random.Generator) -> tuple[int, int]:
    if index in FIXED_SIZES:
        return FIXED_SIZES[index]
    width = int(rng.integers(300, 501))
    return width, int(width * rng.choice([0.75, 1.0, 1.333, 0.667]))


def write_standin(root: str, seed: int = 0) -> str:
    """Write the stand-in under ``root`` (``train/`` and ``val/``, the same 64 JPEGs); returns
    ``root``."""
    rng = np.random.default_rng(seed)
    for index, entry in enumerate(CLASSES):
        wnid = entry.split("_", 1)[0]
        image = picture(rng, *size_of(index, rng))
        if index in GRAYSCALE:
            image = image.convert("L")
        options = {"quality": int(rng.integers(85, 99))}
        if image.mode == "RGB":
            options["subsampling"] = SUBSAMPLING.get(index, 0)
        for split in ("train", "val"):
            folder = os.path.join(root, split, wnid)
            os.makedirs(folder, exist_ok=True)
            image.save(os.path.join(folder, f"{entry}.JPEG"), "JPEG", **options)
    return root


def write_twins(root: str, count: int = 16, seed: int = 0) -> str:
    """ImageNet-layout ``root/{train,val}/n00000000/`` holding ``count`` copies of one picture
    (:func:`picture`, 96 x 80 px): batches of it differ only in their random draws (crops,
    flips, augmentation policies), never in which images they hold. Returns ``root``."""
    image = picture(np.random.default_rng(seed), 96, 80)
    for split in ("train", "val"):
        folder = os.path.join(root, split, "n00000000")
        os.makedirs(folder, exist_ok=True)
        for i in range(count):
            image.save(os.path.join(folder, f"n00000000_{i}.JPEG"), "JPEG", quality=90)
    return root
