/*
 * dlpack.h: the DLPack ABI as fmha_native reads and writes it.
 *
 * Owns our own declaration of the DLPack 1.0 structs (written from the
 * specification at dmlc.github.io/dlpack and the Python array API's
 * "data interchange" page), the flag bits, the device and dtype codes we use,
 * the four PyCapsule names of the Python exchange protocol, and the stream
 * numbers that protocol gives special meanings.  Only the
 * layout matters for interoperability, so the enum-typed fields of the
 * specification are declared here as fixed-width integers of the same size;
 * the static assertions at the bottom pin the layout.
 */
#ifndef FMHA_DLPACK_H
#define FMHA_DLPACK_H

#include <stddef.h>
#include <stdint.h>

/* The version we produce, and the highest major version we can read. */
#define FMHA_DLPACK_MAJOR_VERSION 1
#define FMHA_DLPACK_MINOR_VERSION 0

/* PyCapsule names: a consumer renames a capsule to the "used_" name once it
 * owns the tensor, which tells the capsule's destructor not to delete it. */
#define FMHA_DLPACK_CAPSULE "dltensor"
#define FMHA_DLPACK_CAPSULE_USED "used_dltensor"
#define FMHA_DLPACK_CAPSULE_VERSIONED "dltensor_versioned"
#define FMHA_DLPACK_CAPSULE_VERSIONED_USED "used_dltensor_versioned"

/* The legacy default stream as a DLPack `stream` argument: CUDA reserves 0
 * (ambiguous) and names the legacy stream 1; ROCm names its default stream 0. */
#define FMHA_DLPACK_CUDA_LEGACY_STREAM 1
#define FMHA_DLPACK_ROCM_DEFAULT_STREAM 0
/* A consumer passing stream=-1 asks the producer not to synchronise. */
#define FMHA_DLPACK_NO_SYNC_STREAM (-1)

/* DLDeviceType values (the subset that matters to us, numbered as in the spec). */
enum {
    kDLCPU = 1,
    kDLCUDA = 2,
    kDLCUDAHost = 3,
    kDLROCM = 10,
    kDLROCMHost = 11,
    kDLCUDAManaged = 13,
};

/* DLDataTypeCode values. */
enum {
    kDLInt = 0,
    kDLUInt = 1,
    kDLFloat = 2,
    kDLOpaqueHandle = 3,
    kDLBfloat = 4,
    kDLComplex = 5,
    kDLBool = 6,
    /* DLPack 1.1: the low-precision float kinds, each a code of its own. */
    kDLFloat8_e3m4 = 7,
    kDLFloat8_e4m3 = 8,
    kDLFloat8_e4m3b11fnuz = 9,
    kDLFloat8_e4m3fn = 10,
    kDLFloat8_e4m3fnuz = 11,
    kDLFloat8_e5m2 = 12,
    kDLFloat8_e5m2fnuz = 13,
    kDLFloat8_e8m0fnu = 14,
    kDLFloat6_e2m3fn = 15,
    kDLFloat6_e3m2fn = 16,
    kDLFloat4_e2m1fn = 17,
};

/* DLManagedTensorVersioned.flags bits. */
#define DLPACK_FLAG_BITMASK_READ_ONLY (UINT64_C(1) << 0)
#define DLPACK_FLAG_BITMASK_IS_COPIED (UINT64_C(1) << 1)
#define DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED (UINT64_C(1) << 2)

typedef struct DLPackVersion {
    uint32_t major;
    uint32_t minor;
} DLPackVersion;

typedef struct DLDevice {
    int32_t device_type; /* a DLDeviceType (a C enum: int-sized) */
    int32_t device_id;
} DLDevice;

typedef struct DLDataType {
    uint8_t code;   /* a DLDataTypeCode */
    uint8_t bits;   /* bits per lane */
    uint16_t lanes; /* 1 for scalars */
} DLDataType;

typedef struct DLTensor {
    void *data;           /* base pointer; element 0 is at data + byte_offset */
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t *shape;
    int64_t *strides;     /* in elements; NULL means compact row-major */
    uint64_t byte_offset;
} DLTensor;

/* Pre-1.0 ("legacy") managed tensor, exchanged in a "dltensor" capsule. */
typedef struct DLManagedTensor {
    DLTensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensor *self); /* may be NULL */
} DLManagedTensor;

/* 1.0 managed tensor, exchanged in a "dltensor_versioned" capsule.  version,
 * manager_ctx and deleter stay where they are in every future version, so a
 * consumer may read the version and call the deleter of any major version. */
typedef struct DLManagedTensorVersioned {
    DLPackVersion version;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensorVersioned *self); /* may be NULL */
    uint64_t flags;
    DLTensor dl_tensor;
} DLManagedTensorVersioned;

#if defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
_Static_assert(sizeof(DLDevice) == 8, "DLDevice is two 32-bit fields");
_Static_assert(sizeof(DLDataType) == 4, "DLDataType is packed into 32 bits");
_Static_assert(offsetof(DLTensor, device) == sizeof(void *), "DLTensor.device follows data");
_Static_assert(offsetof(DLManagedTensorVersioned, manager_ctx) == 8,
               "DLManagedTensorVersioned.manager_ctx follows the 8-byte version");
#endif

#endif /* FMHA_DLPACK_H */
