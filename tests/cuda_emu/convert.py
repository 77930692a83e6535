#!/usr/bin/env python3
"""Turns a CUDA source (kernels/cuda/*.cu) or one of its headers into host C++ for the CPU emulator in shim/.

Usage: convert.py INPUT OUTPUT

Rewrites, each checked (the script fails if the source no longer has the shape it expects, so a change in a
kernel that the emulator cannot follow breaks the build instead of silently testing something else):
  - namespace gpt::cuda -> gpt::cuda_emu, so the emulated code never collides with the real CUDA objects
    in gpt_engine (when the build has CUDA);
  - `extern __shared__ [__align__(n)] T name[];` -> a pointer to the block's dynamic shared memory;
  - static `__shared__ T name[A][B]...;` -> a reference to a per-block buffer (emu_shared_alloc);
  - `kernel<<<grid, block, smem, stream>>>(args)` -> `emulate_launch(kernel, grid, block, smem, stream, args)`;
  - a kernel with `__launch_bounds__(N[, M])` gets `emu_check_launch_bounds(N);` first in its body (a GPU refuses
    a launch of more threads per block than N);
  - common.cuh: grid_for's cap becomes emu_grid_cap (a test lowers it to exercise the grid-stride loops);
  - cuda_backend.h, cuda_backend.cu, cuda_backend_ops.cu: CudaBackend -> CudaEmuBackend, make_cuda_backend ->
    make_cuda_emu_backend, and their cuda:: names -> cuda_emu::, so the backend's host code runs over the emulated
    kernels;
  - engine/comm/nccl_communicator.{h,cc} and tests/comm/nccl_communicator_test.cc: make_nccl_communicator ->
    make_nccl_emu_communicator, cuda_device_count -> cuda_emu_device_count (no clash with gpt_engine's), so
    the NCCL Communicator and its tests run over the NCCL shim (shim/nccl.h, nccl_emu.cc).
The output starts with `#line 1 "INPUT"`, so compiler messages and sanitizer reports name the real source.
"""
import os
import re
import sys


def fail(msg):
    sys.exit('convert.py: %s: %s' % (sys.argv[1], msg))


# The CUDA backend's host code (cuda_backend.h, cuda_backend.cu, cuda_backend_ops.cu) lives in namespace gpt and
# calls the kernels as cuda::...: its class and factory are renamed (no clash with the real ones in gpt_engine) and
# its cuda:: names point at the emulated kernels.
BACKEND_FILES = ('cuda_backend.cu', 'cuda_backend_ops.cu', 'cuda_backend.h')


def convert_backend(s):
    s, n_class = re.subn(r'\bCudaBackend\b', 'CudaEmuBackend', s)
    s = re.sub(r'\bmake_cuda_backend\b', 'make_cuda_emu_backend', s)
    s = re.sub(r'\bnamespace cuda\b', 'namespace cuda_emu', s)
    s = re.sub(r'(?<![\w:])cuda::', 'cuda_emu::', s)
    if n_class == 0:
        fail('no CudaBackend found')
    return s


# The NCCL Communicator (engine/comm) and its GPU test: only their external names change.
COMM_FILES = ('nccl_communicator.cc', 'nccl_communicator.h', 'nccl_communicator_test.cc')


def convert_comm(s):
    s, n_make = re.subn(r'\bmake_nccl_communicator\b', 'make_nccl_emu_communicator', s)
    s = re.sub(r'\bcuda_device_count\b', 'cuda_emu_device_count', s)
    if n_make == 0:
        fail('no make_nccl_communicator found')
    if '<<<' in s or '__shared__' in s:
        fail('device code in a host file the converter does not expect')
    return s


def in_line_comment(s, pos):
    """Whether pos lies after a // on its line (the kernel files have no // inside string literals)."""
    return '//' in s[s.rfind('\n', 0, pos) + 1:pos]


def check_launch_bounds(s):
    """Puts emu_check_launch_bounds(N) first in the body of each kernel declared with __launch_bounds__(N[, M]);
    a __launch_bounds__( in a // comment is prose, left alone."""
    out, pos, n = [], 0, 0
    for m in re.finditer(r'__launch_bounds__\(', s):
        if m.start() < pos or in_line_comment(s, m.start()):
            continue
        depth, i, comma = 1, m.end(), None
        while depth > 0:  # the arguments, to the matching parenthesis
            if i >= len(s):
                fail('unbalanced __launch_bounds__(')
            c = s[i]
            depth += {'(': 1, ')': -1}.get(c, 0)
            if c == ',' and depth == 1 and comma is None:
                comma = i
            i += 1
        bound = s[m.end():comma if comma is not None else i - 1].strip()
        brace = s.find('{', i)
        if brace < 0 or ';' in s[i:brace]:
            fail('__launch_bounds__(%s) not followed by a kernel body' % bound)
        out.append(s[pos:brace + 1])
        out.append(' emu_check_launch_bounds(%s);' % bound)
        pos = brace + 1
        n += 1
    out.append(s[pos:])
    return ''.join(out), n


VECTOR_TYPES = r'\b(?:float4|float2|uint4|uint2|int4|int2|__nv_bfloat162)\b'


def convert(s, name):
    if name in COMM_FILES:
        return convert_comm(s), (0, 0, 0)
    backend = name in BACKEND_FILES
    if backend:
        s = convert_backend(s)
    s, n_ns = re.subn(r'\bnamespace gpt::cuda\b', 'namespace gpt::cuda_emu', s)
    s = re.sub(r'\bgpt::cuda::', 'gpt::cuda_emu::', s)
    if re.search(r'\bcuda::', s):
        fail('a cuda:: qualified name the converter does not rename')

    # Dynamic shared memory: extern __shared__ [__align__(n)] T name[];
    s, n_dyn = re.subn(r'extern\s+__shared__\s+(?:__align__\(\d+\)\s+)?([\w ]+?)\s+(\w+)\s*\[\s*\]\s*;',
                       lambda m: '%s* %s = reinterpret_cast<%s*>(emu_smem);' % (m.group(1), m.group(2), m.group(1)), s)
    # Static shared arrays -> per-block buffers, the k-th declaration a thread executes being the k-th buffer.
    s, n_static = re.subn(
        r'__shared__\s+(\w+)\s+(\w+)((?:\[[^\]]+\])+)\s*;',
        lambda m: '%s (&%s)%s = *reinterpret_cast<%s(*)%s>(emu_shared_alloc(sizeof(%s%s)));' % (
            m.group(1), m.group(2), m.group(3), m.group(1), m.group(3), m.group(1), m.group(3)), s)
    if '__shared__' in s:
        fail('a __shared__ declaration the converter does not handle')

    # Vector accesses: a GPU faults on a float4/uint2/... load or store not aligned to its size, the CPU does not,
    # so the pointer cast to a CUDA vector type becomes emu_vector_cast, which checks the alignment.
    s = re.sub(r'reinterpret_cast<\s*((?:const\s+)?(?:%s)\s*\*)\s*>\s*\(' % VECTOR_TYPES,
               lambda m: 'emu_vector_cast<%s>(' % m.group(1), s)
    if re.search(r'reinterpret_cast<[^<>]*%s' % VECTOR_TYPES, s):
        fail('a cast to a vector type the converter does not rewrite')

    s, n_bounds = check_launch_bounds(s)
    if sum(not in_line_comment(s, m.start()) for m in re.finditer('__launch_bounds__', s)) != n_bounds:
        fail('a __launch_bounds__ the converter does not handle')

    # Launches. The kernel may be a template instance (`k<true>`) and the launch may span lines.
    s, n_launch = re.subn(r'([\w:]+(?:<[^<>();]*>)?)\s*<<<(.*?)>>>\s*\(',
                          lambda m: 'emulate_launch(%s, %s, ' % (m.group(1), m.group(2)), s, flags=re.S)
    if '<<<' in s or '>>>' in s:
        fail('a kernel launch the converter does not handle')

    if name == 'common.cuh':
        cap = 'blocks < 65535 * 8 ? (blocks > 0 ? blocks : 1) : 65535 * 8'
        if cap not in s:
            fail("grid_for's cap changed; update convert.py")
        s = s.replace(cap, 'blocks < emu_grid_cap ? (blocks > 0 ? blocks : 1) : emu_grid_cap')

    if name.endswith('.cu') and n_launch == 0 and not backend:
        fail('no kernel launch found')
    if n_ns == 0 and not backend:
        fail('no gpt::cuda namespace found')
    return s, (n_dyn, n_static, n_launch)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    src, out = sys.argv[1], sys.argv[2]
    with open(src) as f:
        text = f.read()
    name = os.path.basename(src)
    body, _ = convert(text, name)
    head = '// Generated by tests/cuda_emu/convert.py from %s. Do not edit.\n' % src
    if name.endswith('.cu'):
        head += '#include "cuda_runtime.h"\n'
    head += '#line 1 "%s"\n' % src
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    tmp = out + '.tmp'
    with open(tmp, 'w') as f:
        f.write(head + body)
    os.replace(tmp, out)


if __name__ == '__main__':
    main()
