"""Client media (audio, images, video) before admission: parts as given (`parts`), the limits and
their tally (`limits`), the reference sizes (`sizes`), one file decoded (`file_decode`) and a
request's files decoded off the event loop in a bounded pool (`decode_pool`)."""
