"""Which kernel sources a CPU's build compiles (kernels/cpu_ext.py): only the instruction-set units the CPU
can run, a stand-in for each other one, and a build directory of its own when a unit is left out."""
from pathlib import Path
import re

from byzantium.kernels import cpu_ext

ZEN3 = frozenset("fpu sse sse2 ssse3 sse4_1 sse4_2 avx avx2 fma bmi2".split())  # no AVX-512
SKYLAKE_X = ZEN3 | {"avx512f", "avx512bw", "avx512vl", "avx512cd", "avx512dq"}  # AVX-512, no bf16
SAPPHIRE_RAPIDS = SKYLAKE_X | {"avx512_bf16", "amx_bf16"}


def names(flags):
    return [p.name for p in cpu_ext.chosen_sources(flags)]


def test_an_avx2_only_cpu_compiles_no_avx512_unit():
    chosen = names(ZEN3)
    assert "cpu_avx2.cpp" in chosen and "cpu_avx512.cpp" not in chosen and "cpu_avx512_bf16.cpp" not in chosen
    assert {"cpu_avx512_absent.cpp", "cpu_avx512_bf16_absent.cpp"} <= set(chosen)
    assert cpu_ext.instruction_sets(cpu_ext.chosen_sources(ZEN3)) == "avx2"
    sources, line = cpu_ext.build_plan(ZEN3)
    assert "for avx2 (" in line and "left out, as this CPU cannot run them: cpu_avx512.cpp, cpu_avx512_bf16.cpp" in line
    assert "minute" in line


def test_avx512_without_bf16_and_with_it():
    assert "cpu_avx512.cpp" in names(SKYLAKE_X) and "cpu_avx512_bf16_absent.cpp" in names(SKYLAKE_X)
    assert "cpu_avx512_bf16.cpp" not in names(SKYLAKE_X)
    full = names(SAPPHIRE_RAPIDS)
    assert "cpu_avx512.cpp" in full and "cpu_avx512_bf16.cpp" in full and not [n for n in full if "absent" in n]
    assert names(None) == full  # flags unknown: every unit, as before
    assert "left out" not in cpu_ext.build_plan(SAPPHIRE_RAPIDS)[1]


def test_the_avx2_build_has_a_directory_of_its_own():
    full, avx2 = cpu_ext.build_directory(SAPPHIRE_RAPIDS), cpu_ext.build_directory(ZEN3)
    assert full != avx2 and avx2.name.endswith("-avx2") and full.parent == avx2.parent
    assert cpu_ext.build_directory(SKYLAKE_X).name.endswith("-avx2-avx512")


def test_flags_are_read_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: AMD Ryzen 9 5950X\nflags\t\t: fpu avx avx2 fma\n\n"
                    "processor\t: 1\nflags\t\t: fpu avx avx2 fma\n")
    assert cpu_ext.cpu_flags(info) == {"fpu", "avx", "avx2", "fma"}
    assert cpu_ext.cpu_flags(tmp_path / "missing") is None


def test_each_stand_in_defines_what_its_unit_instantiates():
    """A kernel added to a unit and not to its stand-in would leave the AVX2-only build unable to link."""
    here = Path(cpu_ext.__file__).parent
    for _, _, unit, absent in cpu_ext.OPTIONAL_UNITS:
        instantiated = set(re.findall(r"^template struct (\w+<[^;]*>);", (here / unit).read_text(), re.M))
        stood_in = set(re.findall(r"^template <> void (\w+<[^:]*>)::", (here / absent).read_text(), re.M))
        def normal(names):
            return {re.sub(r"\bBf16\b", "uint16_t", re.sub(r"\s+", "", name)) for name in names}
        assert normal(instantiated) == normal(stood_in), (unit, absent)
        assert len(stood_in) >= len(instantiated)
