"""Source videos: decoding with PyAV and the indexes of datasets' videos and splits."""
