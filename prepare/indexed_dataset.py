"""A streaming writer of Megatron-LM indexed datasets (PREFIX.bin + PREFIX.idx, "MMIDIDX" version 1,
little-endian; the layout ulysses-train reads): ids are appended to PREFIX.bin as documents arrive,
only the documents' lengths stay in memory (4 bytes each), and PREFIX.idx is written at the end, a
block of documents at a time:
  magic "MMIDIDX\\x00\\x00" | version u64 = 1 | dtype code u8 | sequence_count u64 |
  document_count u64 | sequence_lengths i32[sequence_count] | sequence_pointers i64[sequence_count]
  (byte offsets into .bin) | document_indices i64[document_count] (0, 1, ..., sequence_count:
  one sequence per document)."""
import struct
from array import array

import numpy as np

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
DTYPE_CODES = {"uint8": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5, "uint16": 8}
IDX_BLOCK = 1 << 16  # documents per block of PREFIX.idx computed and written at once


class IndexedDatasetWriter:
    def __init__(self, prefix, dtype_name):
        self.prefix = prefix
        self.dtype = np.dtype(dtype_name).newbyteorder("<")
        self.code = DTYPE_CODES[dtype_name]
        self.lengths = array("i")  # [documents] int32
        self.bin_file = open(prefix + ".bin", "wb")

    def add(self, values, lengths):
        """Appends documents: `values` [sum(lengths)] their ids one after another, `lengths`
        [documents] (int32 array)."""
        self.bin_file.write(np.ascontiguousarray(values, self.dtype).tobytes())
        self.lengths.frombytes(np.ascontiguousarray(lengths, np.int32).tobytes())

    def finish(self):
        self.bin_file.close()
        count = len(self.lengths)
        lengths = np.frombuffer(self.lengths, np.int32) if count else np.zeros(0, np.int32)
        blocks = range(0, count, IDX_BLOCK)
        with open(self.prefix + ".idx", "wb") as idx_file:
            idx_file.write(MAGIC)
            idx_file.write(struct.pack("<QBQQ", VERSION, self.code, count, count + 1))
            for start in blocks:
                idx_file.write(lengths[start:start + IDX_BLOCK].astype("<i4").tobytes())
            offset = 0  # byte offset of the block's first document in PREFIX.bin
            for start in blocks:
                sizes = lengths[start:start + IDX_BLOCK].astype(np.int64) * self.dtype.itemsize
                ends = np.cumsum(sizes) + offset
                idx_file.write((ends - sizes).astype("<i8").tobytes())
                offset = int(ends[-1])
            for start in range(0, count + 1, IDX_BLOCK):
                idx_file.write(np.arange(start, min(start + IDX_BLOCK, count + 1),
                                         dtype="<i8").tobytes())

    def close(self):
        if not self.bin_file.closed:
            self.bin_file.close()
