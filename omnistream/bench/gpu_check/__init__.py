"""`tools/gpu-check`'s pieces, importable so the test suite runs them on the CPU and they keep working
while no GPU is lent: the pipeline's parity against transformers (parity.py), engine step times
(steps.py, tools/step-times' stepping), RTF and TTFP through a real `omnistream up` (served.py), and
`--all`, the one prepared device run that puts them in one table next to vLLM-Omni's published
figures (run_all.py, parts.py, table.py, published.py).
"""
