// The shape vocabulary used in every tensor comment of this project. Nothing to compile.
//
//   bs   micro-batch size (sequences per rank per micro-step)
//   sl   full sequence length (padded to a multiple of sp)
//   sp   sequence-parallel degree; a rank holds sl/sp contiguous positions
//   dp   data-parallel degree; world = dp * sp
//   hq   query heads            hkv  key/value heads (GQA: hq % hkv == 0)
//   hd   head dim               h    hidden size (usually hq * hd)
//   ffn  MLP intermediate size  V    vocabulary size
//   L    number of decoder layers
//   T    tokens in a tile (a slice of sl/sp)
//
// A tensor comment reads `// [bs, sl/sp, hq, hd]`; an all-to-all states both sides,
// `// [bs, sl/sp, hq, hd] -> [bs, sl, hq/sp, hd]`.
#pragma once
