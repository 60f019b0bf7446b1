"""Optical flow: TV-L1 (OpenCV and PyTorch), DIS, the uint8 storage format, and extraction into a store."""
