"""The decoders taken apart, one thread: ``compared`` (whole images and crop windows, every
library side by side), ``scaled`` (crop + scale in one decode against a full decode),
``acceptance`` (the acceptance rule's margins and costs)."""
