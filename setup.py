"""Build of fmha_native: the C host code with the system compiler, the HIP kernels
with nvcc (NVIDIA) and/or hipcc (AMD) when found.

Environment:
  FMHA_BACKENDS    comma list among cpu, cuda, hip (default: cpu plus every GPU
                   toolchain found on PATH / CUDA_HOME / ROCM_PATH)
  FMHA_CUDA_ARCHS  semicolon list of SM targets, default "80;90a"
  FMHA_HIP_ARCHS   semicolon list of AMD targets, default "gfx90a;gfx942"
  FMHA_NVCC_THREADS parallel kernel compiles (default: CPU count)
  FMHA_KERNEL_FLAGS extra flags for nvcc/hipcc (tuning experiments, e.g.
                   -lineinfo)
"""
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
KERNEL_DIR = "kernels"
KERNEL_SOURCES = sorted(
    os.path.join(KERNEL_DIR, f) for f in os.listdir(os.path.join(ROOT, KERNEL_DIR))
    if f.endswith(".hip")
) if os.path.isdir(os.path.join(ROOT, KERNEL_DIR)) else []
HOST_SOURCES = sorted(os.path.join("csrc", f) for f in os.listdir(os.path.join(ROOT, "csrc"))
                      if f.endswith(".c"))
HEADERS = sorted(os.path.join(d, f) for d in ("csrc", KERNEL_DIR)
                 if os.path.isdir(os.path.join(ROOT, d))
                 for f in os.listdir(os.path.join(ROOT, d)) if f.endswith(".h"))


def _log(msg):
    print(f"fmha_native build: {msg}", file=sys.stderr)


def find_nvcc():
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and os.path.exists(os.path.join(home, "bin", "nvcc")):
            return os.path.join(home, "bin", "nvcc"), home
    nvcc = shutil.which("nvcc")
    if nvcc:
        return nvcc, os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
    return None, None


def find_hipcc():
    for home in (os.environ.get("ROCM_PATH"), "/opt/rocm"):
        if home and os.path.exists(os.path.join(home, "bin", "hipcc")):
            return os.path.join(home, "bin", "hipcc")
    return shutil.which("hipcc")


def requested_backends():
    env = os.environ.get("FMHA_BACKENDS")
    if env:
        wanted = {b.strip().lower() for b in env.split(",") if b.strip()}
        unknown = wanted - {"cpu", "cuda", "hip"}
        if unknown:
            raise SystemExit(f"FMHA_BACKENDS: unknown backend(s) {sorted(unknown)}; "
                             "expected a comma list of cpu, cuda, hip")
        wanted.add("cpu")  # the CPU backend is always built
        return wanted, True
    wanted = {"cpu"}
    if find_nvcc()[0]:
        wanted.add("cuda")
    if find_hipcc():
        wanted.add("hip")
    return wanted, False


def cuda_gencode_flags(archs):
    flags = []
    for arch in archs:
        arch = arch.strip()
        if not arch:
            continue
        # "90a" needs the -gencode form: the sm_90a shorthand also runs a plain sm_90 pass.
        flags.append(f"-gencode=arch=compute_{arch},code=sm_{arch}")
    return flags


class FmhaBuildExt(build_ext):
    """Compiles kernels/*.hip with the GPU compilers first, then links them in."""

    def build_extension(self, ext):
        backends, explicit = requested_backends()
        if "cuda" in backends and "hip" in backends:
            if explicit:
                raise SystemExit("FMHA_BACKENDS: build either cuda or hip into one module, not both")
            _log("both nvcc and hipcc found; building the CUDA kernels (set FMHA_BACKENDS=hip "
                 "for AMD)")
            backends.discard("hip")
        build_dir = os.path.abspath(os.path.join(self.build_temp, "kernels"))
        os.makedirs(build_dir, exist_ok=True)
        if "cuda" in backends:
            self._add_cuda(ext, build_dir, explicit)
        elif "hip" in backends:
            self._add_hip(ext, build_dir, explicit)
        else:
            _log("building the CPU backend only")
        super().build_extension(ext)

    def _compile_kernels(self, compiler, build_dir, check=None):
        """Compile every kernels/*.hip with `compiler` (+ FMHA_KERNEL_FLAGS); the objects.
        `check(output)` returns (lines to show, lines that fail the build)."""
        flags = compiler + os.environ.get("FMHA_KERNEL_FLAGS", "").split()
        commands, objects = [], []
        for src in KERNEL_SOURCES:
            obj = os.path.join(build_dir, os.path.basename(src) + ".o")
            commands.append(flags + ["-c", src, "-o", obj])
            objects.append(obj)
        self._compile_all(commands, check)
        return objects

    def _compile_all(self, commands, check=None):
        threads = int(os.environ.get("FMHA_NVCC_THREADS", os.cpu_count() or 1))
        def run(cmd):
            _log(" ".join(cmd))
            return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
            results = list(pool.map(run, commands))
        failed = False
        for cmd, res in zip(commands, results):
            output, bad = (res.stdout + res.stderr), []
            if check:
                output, bad = check(output)
            if output.strip():
                sys.stderr.write(output)
            if res.returncode != 0 or bad:
                failed = True
        if failed:
            raise SystemExit("fmha_native build: a kernel failed to compile (see above)")

    def _add_cuda(self, ext, build_dir, explicit):
        nvcc, cuda_home = find_nvcc()
        if not nvcc:
            raise SystemExit("FMHA_BACKENDS asks for cuda but nvcc was not found "
                             "(set CUDA_HOME or put nvcc on PATH)")
        archs = os.environ.get("FMHA_CUDA_ARCHS", "80;90a").split(";")
        common = ["-std=c++17", "-O3", "-Xcompiler", "-fPIC", "-Icsrc", "-Ikernels",
                  "-DFMHA_WITH_CUDA=1", "--expt-relaxed-constexpr", "-Werror=all-warnings",
                  "-Xptxas=-v,-warn-spills,-warn-lmem-usage"] + cuda_gencode_flags(archs)
        ext.extra_objects += self._compile_kernels([nvcc, "-x", "cu"] + common, build_dir,
                                                   check=ptxas_check)
        ext.define_macros.append(("FMHA_WITH_CUDA", "1"))
        ext.include_dirs.append(os.path.join(cuda_home, "include"))
        libdir = os.path.join(cuda_home, "lib64")
        if not os.path.isdir(libdir):
            libdir = os.path.join(cuda_home, "lib")
        ext.library_dirs.append(libdir)
        # Static runtime: importing the module needs no CUDA runtime on the machine.
        ext.libraries += ["cudart_static", "rt", "pthread", "dl", "stdc++"]

    def _add_hip(self, ext, build_dir, explicit):
        hipcc = find_hipcc()
        if not hipcc:
            raise SystemExit("FMHA_BACKENDS asks for hip but hipcc was not found "
                             "(set ROCM_PATH or put hipcc on PATH)")
        # hipcc picks the NVIDIA platform when nvcc is found and no plain clang++ is
        # (Debian ships clang++-15); this backend is the AMD one.
        os.environ["HIP_PLATFORM"] = "amd"
        archs = [a.strip() for a in os.environ.get("FMHA_HIP_ARCHS", "gfx90a;gfx942").split(";")
                 if a.strip()]
        # A file, not stdin: hipcc applies its HIP flags only to sources it recognises.
        probe_src = os.path.join(build_dir, "arch_probe.hip")
        with open(probe_src, "w") as f:
            f.write("#include <hip/hip_runtime.h>\n__global__ void fmha_arch_probe() {}\n")
        usable = []
        for arch in archs:
            probe = subprocess.run([hipcc, f"--offload-arch={arch}", "-c", probe_src,
                                    "-o", os.devnull], capture_output=True, text=True)
            if probe.returncode == 0:
                usable.append(arch)
            else:
                _log(f"hipcc cannot target {arch}; skipping it "
                     f"({(probe.stderr.strip().splitlines() or ['?'])[0]})")
        if not usable:
            raise SystemExit(f"hipcc can target none of FMHA_HIP_ARCHS={archs}")
        built = ";".join(usable)
        common = ["-std=c++17", "-O3", "-fPIC", "-Icsrc", "-Ikernels", "-DFMHA_WITH_HIP=1",
                  f'-DFMHA_HIP_ARCHS_BUILT="{built}"', "-Wall", "-Werror"] + \
                 [f"--offload-arch={a}" for a in usable]
        ext.extra_objects += self._compile_kernels([hipcc, "-x", "hip"] + common, build_dir)
        ext.define_macros += [("FMHA_WITH_HIP", "1"),
                              ("FMHA_HIP_ARCHS_BUILT", f'"{built}"')]
        rocm = os.path.dirname(os.path.dirname(os.path.realpath(hipcc)))
        for inc in (os.path.join(rocm, "include"), "/usr/include/hip"):
            if os.path.isdir(inc):
                ext.include_dirs.append(inc)
        ext.libraries += ["amdhip64", "stdc++"]
        for lib in (os.path.join(rocm, "lib"), "/usr/lib/x86_64-linux-gnu"):
            if os.path.isdir(lib):
                ext.library_dirs.append(lib)


def ptxas_check(output):
    """ptxas -v: drop its per-kernel info lines, but fail the build on the note that
    wgmma instructions were serialized (ptxas gives it only as info, and it silently
    turns the asynchronous tile products of kernels/fwd_mma.h into synchronous ones)."""
    show, bad = [], []
    for line in output.splitlines():
        if "Potential Performance Loss" in line:
            bad.append(line)
            show.append("error (fmha_native build): " + line)
        elif not (line.startswith("ptxas info") or line.startswith("    ")):
            show.append(line)
    return "".join(l + "\n" for l in show), bad


def numpy_include():
    import numpy
    return numpy.get_include()


ext = Extension(
    "_fmha_native",
    sources=HOST_SOURCES,
    depends=HEADERS + KERNEL_SOURCES,
    include_dirs=["csrc", numpy_include()],
    define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    extra_compile_args=["-std=c11", "-O3", "-Wall", "-Wextra", "-fvisibility=hidden",
                        "-pthread"],
    extra_link_args=["-pthread"],
)

setup(ext_modules=[ext], cmdclass={"build_ext": FmhaBuildExt})
