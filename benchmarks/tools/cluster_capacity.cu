// How many thread-block clusters of a given size fit on the GPU at once, for CTAs of
// 128 threads and a given dynamic shared memory size (1, 2 or 3 CTAs per SM), from
// cudaOccupancyMaxActiveClusters.  nvcc -arch=sm_90a benchmarks/tools/cluster_capacity.cu -o /tmp/cc && /tmp/cc
#include <cstdio>
#include <cuda_runtime.h>

__global__ void probe_kernel(int *out)
{
    extern __shared__ int smem[];
    smem[threadIdx.x] = threadIdx.x;
    if (out)
        out[blockIdx.x] = smem[threadIdx.x ^ 1];
}

int main()
{
    cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    cudaFuncSetAttribute(probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024);
    cudaFuncSetAttribute(probe_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    printf("%s, %d SMs\n", prop.name, prop.multiProcessorCount);
    const int smem_kb[] = {200, 100, 64};
    for (int s : smem_kb)
        for (int cluster = 2; cluster <= 16; cluster *= 2) {
            cudaLaunchConfig_t cfg = {};
            cfg.gridDim = dim3(cluster * 64);
            cfg.blockDim = dim3(128);
            cfg.dynamicSmemBytes = s * 1024;
            cudaLaunchAttribute attr;
            attr.id = cudaLaunchAttributeClusterDimension;
            attr.val.clusterDim.x = cluster;
            attr.val.clusterDim.y = 1;
            attr.val.clusterDim.z = 1;
            cfg.attrs = &attr;
            cfg.numAttrs = 1;
            int n = -1;
            cudaError_t e = cudaOccupancyMaxActiveClusters(&n, probe_kernel, &cfg);
            printf("smem %3d KB/CTA, cluster %2d: %3d clusters (%s)\n", s, cluster, n,
                   e == cudaSuccess ? "ok" : cudaGetErrorString(e));
        }
    return 0;
}
