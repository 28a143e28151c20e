"""The DataLoader-workers pipeline (``--decode-device cpu``): :mod:`.loader`."""
