"""Units shared by the course: import them instead of writing ``2**20`` again."""

MIB = 2**20  # bytes in a mebibyte (what nvidia-smi and PyTorch call "MiB")
