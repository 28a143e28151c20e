"""The converters timed: ``speed`` (``folder2lmdb.py`` against decoding alone, and its
peak memory at ImageNet's size), ``downloads`` (ImageNet as downloaded against class folders)."""
