"""Prints checksums of gzipped IDX image and label files, computed with Python's gzip module.

usage: idx_checksum.py IMAGES.gz LABELS.gz
prints: N H W CHECKSUM(first image) CHECKSUM(all labels) SUM(all pixels)
where CHECKSUM(bytes) = sum((i + 1) * b for i, b in enumerate(bytes)).
"""
import gzip
import struct
import sys


def checksum(data):
    return sum((i + 1) * b for i, b in enumerate(data))


if len(sys.argv) != 3:
    sys.exit(__doc__)
images = gzip.open(sys.argv[1]).read()
labels = gzip.open(sys.argv[2]).read()
magic, n, h, w = struct.unpack(">IIII", images[:16])
assert magic == 0x803 and struct.unpack(">II", labels[:8]) == (0x801, n)
print(n, h, w, checksum(images[16:16 + h * w]), checksum(labels[8:]), sum(images[16:]))
