"""Evaluation with the paper's protocols, free of the reference code's test-set leaks.

- :mod:`~coclr.eval.features`: per-video backbone features (sliding windows, centre crop), cached by
  checkpoint content; evaluation inputs and their checks.
- :mod:`~coclr.eval.retrieval`: test-queries-train nearest-neighbour retrieval, R@k, chunked.
- :mod:`~coclr.eval.linear`: BatchNorm + linear probe, hyper-parameters chosen on held-out train videos.
- :mod:`~coclr.eval.finetune`: end-to-end finetuning, centre-crop and ten-crop test, resumable.
- :mod:`~coclr.eval.fusion`: two-stream averaging of probabilities, with a same-videos check.
- :mod:`~coclr.eval.report` and :mod:`~coclr.eval.gallery`: Table 1, Figure 4 and Figure 5 of the paper.
"""
