"""Build of fmha_native: the C host code with the system compiler, the HIP kernels
with nvcc (NVIDIA) and/or hipcc (AMD) when found.

Environment:
  FMHA_BACKENDS    comma list among cpu, cuda, hip (default: cpu plus every GPU
                   toolchain found on PATH / CUDA_HOME / ROCM_PATH)
  FMHA_CUDA_ARCHS  semicolon list of SM targets, default "80;90a"
  FMHA_HIP_ARCHS   semicolon list of AMD targets, default "gfx90a;gfx942"
  FMHA_HIPCC       the HIP compiler (default: hipcc from ROCM_PATH, /opt/rocm or
                   PATH); a clang++ that takes -x hip works too, with its ROCm
                   paths given in FMHA_KERNEL_FLAGS (.ci/hip_build.sh does this)
  FMHA_NVCC_THREADS parallel kernel compiles (default: CPU count)
  FMHA_KERNEL_FLAGS extra flags for nvcc/hipcc (tuning experiments, e.g.
                   -lineinfo)

Rebuilds in the same checkout (pip reuses build/): each kernel object is named
by a hash of its compile command, the compiler and the text of the source and
every header, so an unchanged kernel is never compiled twice and a changed one
never reused; the extension is relinked whenever the build settings (backends,
archs, flags, compilers, kernel objects) differ from those of the last build in
this build folder, which setuptools alone would not do (it compares only file
times against the old module).
"""
import hashlib
import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import setuptools
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# pyproject.toml's license is an SPDX expression (PEP 639), which setuptools reads
# from version 77 on; older ones reject the file with a schema error that does not
# say so. pip's default build isolation installs what pyproject.toml asks for.
if int(setuptools.__version__.split(".")[0]) < 77:
    raise SystemExit(f"fmha_native build: setuptools {setuptools.__version__} is too old "
                     "(needs >= 77). Build with pip's default build isolation "
                     "(`pip install .`), or `pip install 'setuptools>=77'` before "
                     "`pip install --no-build-isolation .`")

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
    if os.environ.get("FMHA_HIPCC"):
        return shutil.which(os.environ["FMHA_HIPCC"]) or os.environ["FMHA_HIPCC"]
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
        settings = self._settings(ext, backends)
        stamp = os.path.join(self.build_temp, "fmha_build_settings.json")
        try:
            with open(stamp) as f:
                previous = json.load(f)
        except (OSError, ValueError):
            previous = None
        if previous != settings:
            # setuptools would skip the link when the old module is newer than the
            # sources, keeping a module built with other backends or archs.
            if previous is not None:
                changed = sorted(k for k in set(settings) | set(previous)
                                 if settings.get(k) != previous.get(k))
                _log(f"build settings changed since the last build here ({', '.join(changed)}): "
                     "rebuilding the module")
            self.force = True
            self.compiler.force = True
            if os.path.exists(stamp):
                os.remove(stamp)  # a failed build below must not look current
        super().build_extension(ext)
        with open(stamp, "w") as f:
            json.dump(settings, f, indent=1, sort_keys=True)

    def _settings(self, ext, backends):
        """Everything besides the sources that decides the module's content."""
        return {
            "backends": sorted(backends),
            "macros": [list(m) for m in ext.define_macros],
            # numpy's headers sit in a new temporary folder on each isolated
            # build: their version stands for them below.
            "include_dirs": [d for d in ext.include_dirs if d != numpy_include()],
            "library_dirs": list(ext.library_dirs),
            "libraries": list(ext.libraries),
            "kernel_objects": [os.path.basename(o) for o in ext.extra_objects],
            "compile_args": list(ext.extra_compile_args),
            "link_args": list(ext.extra_link_args),
            "host_compiler": [list(getattr(self.compiler, attr, None) or [])
                              for attr in ("compiler_so", "linker_so")],
            "host_env": {var: os.environ.get(var, "") for var in HOST_ENV},
            "numpy": numpy_version(),
        }

    def _compile_kernels(self, compiler, build_dir, check=None):
        """Compile every kernels/*.hip with `compiler` (+ FMHA_KERNEL_FLAGS); the objects.
        `check(output)` returns (lines to show, lines that fail the build).

        An object's name carries a hash of everything that decides its content, so
        one already in build_dir is that very compile and is reused as it is."""
        flags = compiler + kernel_flags()
        common = hashlib.sha256()
        common.update(compiler_identity(compiler[0]).encode())
        for var in COMPILER_ENV:
            common.update(f"\0{var}={os.environ.get(var, '')}".encode())
        for path in HEADERS:
            common.update(b"\0" + path.encode() + b"\0" + _read(path))
        commands, objects = [], []
        for src in KERNEL_SOURCES:
            digest = common.copy()
            digest.update(b"\0" + "\0".join(flags).encode() + b"\0" + _read(src))
            stem = os.path.join(build_dir, f"{os.path.basename(src)}.{digest.hexdigest()[:16]}")
            obj = stem + ".o"
            objects.append(obj)
            if os.path.exists(obj):
                _log(f"reusing {os.path.relpath(obj)} (same source, headers, compiler and flags)")
                continue
            # Written under a temporary name and renamed once complete, so an
            # interrupted compile never leaves an object that looks finished.
            commands.append((flags + ["-c", src, "-o", stem + ".tmp.o"], stem + ".tmp.o", obj))
        self._compile_all(commands, check)
        return objects

    def _compile_all(self, commands, check=None):
        """Run (command, temporary output, final output) triples; a compile that
        succeeds (and passes `check`) is renamed to its final name."""
        if not commands:
            return
        threads = int(os.environ.get("FMHA_NVCC_THREADS", os.cpu_count() or 1))
        def run(item):
            _log(" ".join(item[0]))
            return subprocess.run(item[0], cwd=ROOT, capture_output=True, text=True)
        with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
            results = list(pool.map(run, commands))
        failed = False
        for (cmd, tmp, final), res in zip(commands, results):
            output, bad = (res.stdout + res.stderr), []
            if check:
                output, bad = check(output)
            if output.strip():
                sys.stderr.write(output)
            if res.returncode != 0 or bad:
                failed = True
                if os.path.exists(tmp):
                    os.remove(tmp)
            else:
                os.replace(tmp, final)
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
        # The planner takes the sm_90a kernel only when its code is in the module.
        built = ";".join(a.strip() for a in archs if a.strip())
        ext.define_macros.append(("FMHA_CUDA_ARCHS_BUILT", f'"{built}"'))
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
            probe = subprocess.run([hipcc] + kernel_flags() +
                                   [f"--offload-arch={arch}", "-c", probe_src,
                                    "-o", os.path.join(build_dir, "arch_probe.o")],
                                   capture_output=True, text=True)
            if probe.returncode == 0:
                usable.append(arch)
            else:
                _log(f"{os.path.basename(hipcc)} cannot target {arch}; skipping it "
                     f"({(probe.stderr.strip().splitlines() or ['?'])[0]})")
        if not usable:
            raise SystemExit(f"{hipcc} can target none of FMHA_HIP_ARCHS={archs}")
        built = ";".join(usable)
        common = ["-std=c++17", "-O3", "-fPIC", "-Icsrc", "-Ikernels", "-DFMHA_WITH_HIP=1",
                  f'-DFMHA_HIP_ARCHS_BUILT="{built}"', "-Wall", "-Werror"] + \
                 [f"--offload-arch={a}" for a in usable]
        ext.extra_objects += self._compile_kernels([hipcc, "-x", "hip"] + common, build_dir)
        ext.define_macros += [("FMHA_WITH_HIP", "1"),
                              ("FMHA_HIP_ARCHS_BUILT", f'"{built}"')]
        # hipcc lives in <rocm>/bin; a plain clang (FMHA_HIPCC) says nothing of ROCm.
        rocm = os.environ.get("ROCM_PATH") or (
            os.path.dirname(os.path.dirname(os.path.realpath(hipcc)))
            if os.path.basename(hipcc).startswith("hipcc") else "/usr")
        for inc in (os.path.join(rocm, "include"), "/usr/include/hip"):
            if os.path.isdir(inc):
                ext.include_dirs.append(inc)
        ext.libraries += ["amdhip64", "stdc++"]
        for lib in (os.path.join(rocm, "lib"), "/usr/lib/x86_64-linux-gnu"):
            if os.path.isdir(lib):
                ext.library_dirs.append(lib)


# Variables the GPU compilers read besides their command line (hipcc's perl
# driver takes its clang, device libraries and platform from these).
COMPILER_ENV = ("HIP_PLATFORM", "HIP_CLANG_PATH", "HIP_PATH", "ROCM_PATH", "DEVICE_LIB_PATH",
                "HIPCC_COMPILE_FLAGS_APPEND", "HIP_CLANG_HCC_COMPAT_MODE", "NVCC_PREPEND_FLAGS",
                "NVCC_APPEND_FLAGS", "NVCC_CCBIN")
# Variables the host compile and link read (distutils' sysconfig customization).
HOST_ENV = ("CC", "CXX", "CFLAGS", "CPPFLAGS", "LDFLAGS", "LDSHARED", "AR", "ARFLAGS")

_identities = {}


def kernel_flags():
    return os.environ.get("FMHA_KERNEL_FLAGS", "").split()


def compiler_identity(compiler):
    """The compiler's resolved path and its --version text (a different toolkit at
    the same path gives different objects)."""
    if compiler not in _identities:
        path = shutil.which(compiler) or compiler
        try:
            res = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=120)
            version = res.stdout + res.stderr
        except (OSError, subprocess.SubprocessError) as exc:
            version = f"unknown ({exc})"
        _identities[compiler] = os.path.realpath(path) + "\n" + version
    return _identities[compiler]


def _read(path):
    with open(os.path.join(ROOT, path), "rb") as f:
        return f.read()


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


def numpy_version():
    import numpy
    return numpy.__version__


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
