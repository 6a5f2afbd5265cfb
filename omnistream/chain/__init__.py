"""The stage chain as code: one runner drives thinker -> talker -> code2wav, whatever carries them.

The gateway runs a request's chain over three gRPC streams (gateway/serving/stage_links.py), the
in-process pipeline over the engines themselves (omnistream/pipeline_links.py); both hand `ChainRun`
(run.py) the same three links (links.py), so every hand-off rule between stages is written once.
Each stage's own side of an edge (omnistream/engine/stage_sides.py) is shared by its servicer and
its in-process link. Torch-free and model-neutral: what crosses an edge is
omnistream/request/stage_outputs.py.
"""
