"""Rewrites a CUDA source for the CPU emulation (tools/cuda_emu/README.md): kernel launches
`K<<<grid, block, smem, stream>>>(args)` become `::emu::Launcher(grid, block, ...).Run(K, args)`
and `extern __shared__ T name[];` a per-block buffer.  Usage: rewrite_kernels.py in.cu out.cc"""
import re
import sys

src, dst = sys.argv[1], sys.argv[2]
s = open(src).read()
s = re.sub(r'extern __shared__ (\w+) (\w+)\[\];', r'\1* \2 = ::emu::DynamicSmem<\1>();', s)
s = re.sub(r'(\w+)\s*<<<(.*?)>>>\s*\(',
           lambda m: '::emu::Launcher(' + m.group(2) + ').Run(' + m.group(1) + ', ', s, flags=re.S)
with open(dst, 'w') as f:
    f.write('#include "emu_device.h"\n#line 1 "' + src + '"\n' + s)
