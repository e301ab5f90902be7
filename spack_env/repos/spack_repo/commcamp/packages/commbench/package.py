# commcamp: Spack recipe of commbench (bench_src/ of the commcamp repository).
# Package API v2.2 (Spack >= 1.0); not executed here: Spack cannot be installed on the project's
# machines (spack_env/README.md). tests/test_spack_env.py reads it with `ast` and checks its variants
# against the CMake options of bench_src.

from spack_repo.builtin.build_systems.cmake import CMakePackage
from spack_repo.builtin.build_systems.cuda import CudaPackage
from spack_repo.builtin.build_systems.rocm import ROCmPackage

from spack.package import *


class Commbench(CMakePackage, CudaPackage, ROCmPackage):
    """CPU and GPU communication benchmark of commcamp: one MPI process per core or GPU, host staging,
    peer copies, NCCL/RCCL and GPU-aware MPI transports, per-iteration timing, data validation and
    JSON Lines records (bench_src/schema/commbench-record.schema.json).

    No release is published: build it from a commcamp checkout with a Spack environment that has a
    `develop:` entry (spack_env/<site>/spack.yaml: develop: {commbench: {spec: commbench@=0.1.0,
    path: ../../bench_src}})."""

    license("BSD-3-Clause")

    version("0.1.0")

    # COMMBENCH_BACKEND: cpu (default), cuda (+cuda, CudaPackage) or hip (+rocm, ROCmPackage).
    conflicts("+cuda", when="+rocm", msg="commbench builds one GPU backend: +cuda or +rocm")
    # COMMBENCH_CCL: the NCCL/RCCL transport; ON/OFF (AUTO, "if found", is not reproducible under Spack).
    variant("ccl", default=True, when="+cuda", description="NCCL transport (COMMBENCH_CCL)")
    variant("ccl", default=True, when="+rocm", description="RCCL transport (COMMBENCH_CCL)")
    # COMMBENCH_WERROR: warnings as errors (the project's own builds use it; site compilers may warn).
    variant("werror", default=False, description="Treat compiler warnings as errors (COMMBENCH_WERROR)")

    depends_on("c", type="build")
    # enable_language(CUDA): nvcc compiles host code with the C++ compiler (+rocm: hipcc is CMake's C++ compiler)
    depends_on("cxx", type="build", when="+cuda")
    # bench_src/CMakeLists.txt's (and nccl_tuner/'s) cmake_minimum_required
    depends_on("cmake@3.18:", type="build")
    # MPI is not optional: every transport synchronises and reports through it. Pick the provider
    # with the spec (^cray-mpich, ^openmpi, ^mpich).
    depends_on("mpi")
    depends_on("nccl", when="+cuda+ccl")
    depends_on("hip", when="+rocm")
    depends_on("rccl", when="+rocm+ccl")

    def cmake_args(self):
        spec = self.spec
        args = [self.define("MPI_C_COMPILER", spec["mpi"].mpicc),
                self.define_from_variant("COMMBENCH_WERROR", "werror")]
        if spec.satisfies("+cuda"):
            args.append(self.define("COMMBENCH_BACKEND", "cuda"))
            archs = [arch for arch in spec.variants["cuda_arch"].value if arch != "none"]
            if archs:
                args.append(self.define("COMMBENCH_CUDA_ARCHS", ";".join(archs)))
        elif spec.satisfies("+rocm"):
            args.append(self.define("COMMBENCH_BACKEND", "hip"))
            args.append(self.define("CMAKE_CXX_COMPILER", spec["hip"].hipcc))
            targets = [t for t in spec.variants["amdgpu_target"].value if t != "none"]
            if targets:
                args.append(self.define("COMMBENCH_HIP_ARCHS", ";".join(targets)))
        else:
            args.append(self.define("COMMBENCH_BACKEND", "cpu"))
        if spec.satisfies("+cuda") or spec.satisfies("+rocm"):
            args.append(self.define("COMMBENCH_CCL", "ON" if spec.satisfies("+ccl") else "OFF"))
        return args
