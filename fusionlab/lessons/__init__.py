"""Code that one notebook teaches with (not part of the fusion engine): one module per lesson."""
