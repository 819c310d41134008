"""The end-of-text token: the document separator of text sources, the special token a
trained tokenizer gets by default, the id every document ends with in a store."""

EOT = "<|endoftext|>"
