"""Numbers fixed by the Qwen3-Omni architecture, in one place and without torch.

They are what the released checkpoint has; code that holds a loaded config reads the config (or
`family.describe`) instead, so a checkpoint that differs is served as it is. These are the fallbacks
for config.json files that leave a field out, and for torch-free code with no checkpoint at hand.
"""

MODEL_TYPE = "qwen3_omni_moe"  # config.json `model_type` of every Qwen3-Omni checkpoint

SAMPLE_RATE = 24000  # Code2Wav's output: 24 kHz mono
NUM_CODEBOOKS = 16  # codes per codec frame (codebook 0 from the talker, 1..15 from its code predictor)
CODEBOOK_SIZE = 2048
UPSAMPLE_RATES = (8, 5, 4, 3)  # Code2Wav's decoder ...
UPSAMPLING_RATIOS = (2, 2)  # ... and pre-decoder upsampling: 1920 samples (80 ms) per frame

DEFAULT_SPEAKER = "ethan"
VOICES = ("chelsie", "ethan", "aiden")
# The talker's sequence holds the prompt plus one row per codec frame, and a spoken answer has more
# frames (12.5 per second) than tokens; twice the thinker's context covers it (family.py sizes the
# talker with it, memory.py its KV cache).
TALKER_LENGTH_FACTOR = 2
