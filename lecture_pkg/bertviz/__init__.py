"""bertviz's head view and model view (Jesse Vig, https://github.com/jessevig/bertviz), version
1.4.1, Apache License 2.0 (LICENSE beside this file), copied unchanged.

Chapter 7 draws attention with these two views. The bertviz distribution also carries its neuron
view, whose tokenizers pull in boto3, botocore and sentencepiece (about 35 MB, used by nothing in
the book); these two files and their scripts need only IPython and torch. Use them as bertviz's:
``from lecture_pkg.bertviz import head_view, model_view``.
"""

from .head_view import head_view
from .model_view import model_view

__all__ = ["head_view", "model_view"]
