"""What this machine's CPU can compute natively, read from /proc/cpuinfo's flags.

bfloat16 on CPU: PyTorch and vLLM's CPU kernels run bf16 math in hardware on x86 CPUs with AVX512-BF16 or AMX
(and arm CPUs with the BF16 extension); elsewhere they convert every operand to fp32 and back in software,
which is correct but many times slower than fp32 itself (a 1024² matmul on one core of an AMD EPYC without
them: 7.2 s in bf16, 0.24 s in fp32), so a bf16 run on such a CPU costs more and gains nothing.
"""

from __future__ import annotations

BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")  # x86, x86, arm
CPUINFO = "/proc/cpuinfo"


def cpu_flags(cpuinfo: str) -> set[str]:
    """The feature flags of /proc/cpuinfo text: every `flags` line (x86) or `Features` line (arm), joined."""
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features"):
            flags.update(value.split())
    return flags


def has_bf16(cpuinfo: str) -> bool:
    """Whether the CPU described by /proc/cpuinfo text computes bfloat16 natively
    (AVX512-BF16, AMX, arm BF16)."""
    return not cpu_flags(cpuinfo).isdisjoint(BF16_FLAGS)


def read_cpuinfo(path: str = CPUINFO) -> str:
    """This machine's /proc/cpuinfo ("" where there is none: no flags known)."""
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""
