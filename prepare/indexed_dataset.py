"""A streaming writer of Megatron-LM indexed datasets (PREFIX.bin + PREFIX.idx, "MMIDIDX" version 1,
little-endian; the layout ulysses-train reads): ids are appended to PREFIX.bin as documents arrive,
only the documents' lengths stay in memory (4 bytes each), and PREFIX.idx is written at the end:
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
        self.lengths.extend(lengths.astype(np.int32).tolist())

    def finish(self):
        self.bin_file.close()
        lengths = np.frombuffer(self.lengths, np.int32) if self.lengths else np.zeros(0, np.int32)
        count = len(lengths)
        pointers = np.zeros(count, "<i8")
        if count:
            np.cumsum(lengths[:-1].astype(np.int64) * self.dtype.itemsize, out=pointers[1:])
        with open(self.prefix + ".idx", "wb") as idx_file:
            idx_file.write(MAGIC)
            idx_file.write(struct.pack("<QBQQ", VERSION, self.code, count, count + 1))
            idx_file.write(lengths.astype("<i4").tobytes())
            idx_file.write(pointers.tobytes())
            idx_file.write(np.arange(count + 1, dtype="<i8").tobytes())

    def close(self):
        if not self.bin_file.closed:
            self.bin_file.close()
