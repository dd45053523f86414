"""cluster.cpu: the bf16 probe on /proc/cpuinfo text (fake CPUs both ways, and this machine's)."""

from __future__ import annotations

from cluster.cpu import cpu_flags, has_bf16, read_cpuinfo

# Trimmed /proc/cpuinfo of real CPUs: an AMD EPYC Zen 3 (no bf16), a Sapphire Rapids Xeon (AVX512-BF16 and
# AMX), a Zen 4 EPYC (AVX512-BF16 only), a Graviton3 (arm, BF16 in Features).
ZEN3 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B13
flags\t\t: fpu vme sse sse2 avx avx2 fma bmi2 sha_ni vaes vpclmulqdq
"""
SAPPHIRE_RAPIDS = """processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu avx2 avx512f avx512bw avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8
"""
ZEN4 = "processor\t: 0\nflags\t\t: avx2 avx512f avx512bw avx512_vnni avx512_bf16\n"
AMX_ONLY = "flags\t\t: avx2 amx_bf16 amx_tile\n"
GRAVITON3 = (
    "processor\t: 0\nFeatures\t: fp asimd evtstrm aes sve i8mm bf16 svebf16\nCPU implementer\t: 0x41\n"
)


def test_bf16_needs_one_of_the_flags_as_a_whole_word():
    assert not has_bf16(ZEN3)
    assert has_bf16(SAPPHIRE_RAPIDS) and has_bf16(ZEN4) and has_bf16(AMX_ONLY) and has_bf16(GRAVITON3)
    # other flags that merely contain them
    assert not has_bf16("flags\t\t: avx512_bf16x xamx_bf16 avx512bw\n")
    assert not has_bf16("model name\t: avx512_bf16 in a name, not a flag\n")
    assert not has_bf16("")  # no /proc/cpuinfo: nothing known


def test_flags_of_every_processor_line_are_read():
    assert cpu_flags(ZEN3 + SAPPHIRE_RAPIDS) >= {"sha_ni", "amx_tile"}


def test_this_machines_cpuinfo_agrees_with_its_flags_line():
    text = read_cpuinfo()
    words = {w for line in text.splitlines() if line.startswith(("flags", "Features")) for w in line.split()}
    assert has_bf16(text) == bool(words & {"avx512_bf16", "amx_bf16", "bf16"})
    assert read_cpuinfo("/nonexistent/cpuinfo") == ""
