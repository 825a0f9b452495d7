"""The texts a run reads: the built-in sentences and the CPython documentation corpus, local files
and datasets by a named protocol (windows, strides, budgets), and the settings that name them.
The data files themselves (eval_sentences.txt, chinchilla/) sit in this folder too."""
