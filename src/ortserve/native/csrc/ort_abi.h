/* The few parts of ONNX Runtime's C API that ortserve's custom ops use, declared here.
 *
 * Written for this project (no onnxruntime header is copied or shipped). It follows the published
 * ABI of onnxruntime's C API: `OrtGetApiBase()->GetApi(version)` returns a table of function
 * pointers that only ever grows at its end, so an entry keeps its index in every later version.
 * The table below declares every slot up to the last one the ops call; the slots they call are
 * typed, at their index (checked by the static assertions at the end), the others are padding.
 * The indices were counted from onnxruntime's public header (API version 29) and are checked at
 * run time by tests/unit/test_native_ops.py, which runs the ops in a real InferenceSession.
 *
 * OrtCustomOp is the struct a library fills to describe one op: a version field, then callbacks
 * in a fixed order. ORT reads a callback only when the struct's version is at least the version
 * that added it: the ops set version 17 (InferOutputShapeFn) on runtimes with API 17, else 16 (the
 * one with CreateKernelV2 / KernelComputeV2), and fill nothing later.
 */
#ifndef ORTSERVE_ORT_ABI_H
#define ORTSERVE_ORT_ABI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifdef _WIN32
#define OSG_ORT_CALL __stdcall
#define OSG_EXPORT __declspec(dllexport)
#else
#define OSG_ORT_CALL
#define OSG_EXPORT __attribute__((visibility("default")))
#endif

/* Opaque runtime objects: only ever handled through pointers. */
typedef struct OrtStatus OrtStatus;
typedef struct OrtSessionOptions OrtSessionOptions;
typedef struct OrtCustomOpDomain OrtCustomOpDomain;
typedef struct OrtKernelInfo OrtKernelInfo;
typedef struct OrtKernelContext OrtKernelContext;
typedef struct OrtValue OrtValue;
typedef struct OrtTensorTypeAndShapeInfo OrtTensorTypeAndShapeInfo;
typedef struct OrtShapeInferContext OrtShapeInferContext;
typedef struct OrtCustomOp OrtCustomOp;
typedef struct OrtOpAttr OrtOpAttr;

/* Values of the enums the ops pass or compare (same numbers as ONNX's TensorProto.DataType). */
typedef enum {
  OSG_ORT_OK = 0,
  OSG_ORT_FAIL = 1,
  OSG_ORT_INVALID_ARGUMENT = 2,
  OSG_ORT_NOT_IMPLEMENTED = 9,
} OrtErrorCode;

typedef enum {
  OSG_TENSOR_UNDEFINED = 0,
  OSG_TENSOR_FLOAT = 1,
  OSG_TENSOR_UINT8 = 2,
  OSG_TENSOR_INT64 = 7,
} ONNXTensorElementDataType;

typedef enum { OSG_IO_REQUIRED = 0, OSG_IO_OPTIONAL = 1, OSG_IO_VARIADIC = 2 } OrtCustomOpInputOutputCharacteristic;

typedef enum { OSG_MEM_DEFAULT = 0 } OrtMemType;

typedef enum { OSG_ATTR_INT = 1 } OrtOpAttrType;

/* The API versions the ops ask for: 17 added KernelContext_ParallelFor (onnxruntime 1.17);
 * 16 added CreateKernelV2 / KernelComputeV2 (onnxruntime 1.16), the least the ops can run on
 * (serially). */
#define OSG_ORT_API_PARALLEL 17
#define OSG_ORT_API_MIN 16
#define OSG_CUSTOM_OP_VERSION 16
/* With API 17 the ops also infer their output shapes: OrtCustomOp version 17 has InferOutputShapeFn
 * (and GetStartVersion / GetEndVersion, left NULL: ORT then registers the op from opset 1). */
#define OSG_CUSTOM_OP_VERSION_SHAPES 17

typedef struct OrtApi OrtApi;

typedef struct OrtApiBase {
  const OrtApi *(OSG_ORT_CALL *GetApi)(uint32_t version);
  const char *(OSG_ORT_CALL *GetVersionString)(void);
} OrtApiBase;

struct OrtApi {
  OrtStatus *(OSG_ORT_CALL *CreateStatus)(OrtErrorCode code, const char *msg); /* 0 */
  void *slot_1;
  const char *(OSG_ORT_CALL *GetErrorMessage)(const OrtStatus *status); /* 2 */
  void *slots_3_25[23];
  OrtStatus *(OSG_ORT_CALL *CreateCustomOpDomain)(const char *domain, OrtCustomOpDomain **out); /* 26 */
  OrtStatus *(OSG_ORT_CALL *CustomOpDomain_Add)(OrtCustomOpDomain *domain, const struct OrtCustomOp *op);
  OrtStatus *(OSG_ORT_CALL *AddCustomOpDomain)(OrtSessionOptions *options, OrtCustomOpDomain *domain);
  void *slots_29_50[22];
  OrtStatus *(OSG_ORT_CALL *GetTensorMutableData)(OrtValue *value, void **out); /* 51 */
  void *slots_52_56[5];
  OrtStatus *(OSG_ORT_CALL *CreateTensorTypeAndShapeInfo)(OrtTensorTypeAndShapeInfo **out); /* 57 */
  OrtStatus *(OSG_ORT_CALL *SetTensorElementType)(OrtTensorTypeAndShapeInfo *info, ONNXTensorElementDataType type);
  OrtStatus *(OSG_ORT_CALL *SetDimensions)(OrtTensorTypeAndShapeInfo *info, const int64_t *dims, size_t dims_len);
  OrtStatus *(OSG_ORT_CALL *GetTensorElementType)(const OrtTensorTypeAndShapeInfo *info,
                                                   ONNXTensorElementDataType *out); /* 60 */
  OrtStatus *(OSG_ORT_CALL *GetDimensionsCount)(const OrtTensorTypeAndShapeInfo *info, size_t *out);
  OrtStatus *(OSG_ORT_CALL *GetDimensions)(const OrtTensorTypeAndShapeInfo *info, int64_t *dims,
                                            size_t dims_len);
  OrtStatus *(OSG_ORT_CALL *GetSymbolicDimensions)(const OrtTensorTypeAndShapeInfo *info, const char *names[],
                                                    size_t names_len); /* 63 */
  OrtStatus *(OSG_ORT_CALL *GetTensorShapeElementCount)(const OrtTensorTypeAndShapeInfo *info, size_t *out);
  OrtStatus *(OSG_ORT_CALL *GetTensorTypeAndShape)(const OrtValue *value, OrtTensorTypeAndShapeInfo **out);
  void *slots_66_84[19];
  OrtStatus *(OSG_ORT_CALL *KernelInfoGetAttribute_float)(const OrtKernelInfo *info, const char *name,
                                                          float *out); /* 85 */
  OrtStatus *(OSG_ORT_CALL *KernelInfoGetAttribute_int64)(const OrtKernelInfo *info, const char *name,
                                                          int64_t *out); /* 86 */
  void *slot_87;
  OrtStatus *(OSG_ORT_CALL *KernelContext_GetInputCount)(const OrtKernelContext *ctx, size_t *out); /* 88 */
  OrtStatus *(OSG_ORT_CALL *KernelContext_GetOutputCount)(const OrtKernelContext *ctx, size_t *out);
  OrtStatus *(OSG_ORT_CALL *KernelContext_GetInput)(const OrtKernelContext *ctx, size_t index,
                                                     const OrtValue **out);
  OrtStatus *(OSG_ORT_CALL *KernelContext_GetOutput)(OrtKernelContext *ctx, size_t index,
                                                      const int64_t *dims, size_t dims_len, OrtValue **out);
  void *slot_92;
  void(OSG_ORT_CALL *ReleaseStatus)(OrtStatus *status); /* 93 */
  void *slots_94_98[5];
  void(OSG_ORT_CALL *ReleaseTensorTypeAndShapeInfo)(OrtTensorTypeAndShapeInfo *info); /* 99 */
  void *slots_100_266[167];
  OrtStatus *(OSG_ORT_CALL *ShapeInferContext_GetInputCount)(const OrtShapeInferContext *ctx, size_t *out); /* 267 */
  OrtStatus *(OSG_ORT_CALL *ShapeInferContext_GetInputTypeShape)(const OrtShapeInferContext *ctx, size_t index,
                                                                  OrtTensorTypeAndShapeInfo **info);
  OrtStatus *(OSG_ORT_CALL *ShapeInferContext_GetAttribute)(const OrtShapeInferContext *ctx, const char *name,
                                                             const OrtOpAttr **attr);
  OrtStatus *(OSG_ORT_CALL *ShapeInferContext_SetOutputTypeShape)(const OrtShapeInferContext *ctx, size_t index,
                                                                   const OrtTensorTypeAndShapeInfo *info);
  OrtStatus *(OSG_ORT_CALL *SetSymbolicDimensions)(OrtTensorTypeAndShapeInfo *info, const char *names[],
                                                    size_t names_len); /* 271 */
  OrtStatus *(OSG_ORT_CALL *ReadOpAttr)(const OrtOpAttr *attr, OrtOpAttrType type, void *data, size_t len,
                                         size_t *out); /* 272 */
  void *slot_273;
  OrtStatus *(OSG_ORT_CALL *KernelContext_ParallelFor)(const OrtKernelContext *ctx, void (*fn)(void *, size_t),
                                                        size_t total, size_t num_batch, void *user); /* 274 */
};

/* One op's description and callbacks, in the published order, up to the version-16 fields. */
struct OrtCustomOp {
  uint32_t version;
  void *(OSG_ORT_CALL *CreateKernel)(const struct OrtCustomOp *op, const OrtApi *api, const OrtKernelInfo *info);
  const char *(OSG_ORT_CALL *GetName)(const struct OrtCustomOp *op);
  const char *(OSG_ORT_CALL *GetExecutionProviderType)(const struct OrtCustomOp *op);
  ONNXTensorElementDataType(OSG_ORT_CALL *GetInputType)(const struct OrtCustomOp *op, size_t index);
  size_t(OSG_ORT_CALL *GetInputTypeCount)(const struct OrtCustomOp *op);
  ONNXTensorElementDataType(OSG_ORT_CALL *GetOutputType)(const struct OrtCustomOp *op, size_t index);
  size_t(OSG_ORT_CALL *GetOutputTypeCount)(const struct OrtCustomOp *op);
  void(OSG_ORT_CALL *KernelCompute)(void *kernel, OrtKernelContext *ctx);
  void(OSG_ORT_CALL *KernelDestroy)(void *kernel);
  OrtCustomOpInputOutputCharacteristic(OSG_ORT_CALL *GetInputCharacteristic)(const struct OrtCustomOp *op,
                                                                              size_t index);
  OrtCustomOpInputOutputCharacteristic(OSG_ORT_CALL *GetOutputCharacteristic)(const struct OrtCustomOp *op,
                                                                               size_t index);
  OrtMemType(OSG_ORT_CALL *GetInputMemoryType)(const struct OrtCustomOp *op, size_t index);
  int(OSG_ORT_CALL *GetVariadicInputMinArity)(const struct OrtCustomOp *op);
  int(OSG_ORT_CALL *GetVariadicInputHomogeneity)(const struct OrtCustomOp *op);
  int(OSG_ORT_CALL *GetVariadicOutputMinArity)(const struct OrtCustomOp *op);
  int(OSG_ORT_CALL *GetVariadicOutputHomogeneity)(const struct OrtCustomOp *op);
  OrtStatus *(OSG_ORT_CALL *CreateKernelV2)(const struct OrtCustomOp *op, const OrtApi *api,
                                            const OrtKernelInfo *info, void **kernel);
  OrtStatus *(OSG_ORT_CALL *KernelComputeV2)(void *kernel, OrtKernelContext *ctx);
  /* version 17 */
  OrtStatus *(OSG_ORT_CALL *InferOutputShapeFn)(const struct OrtCustomOp *op, OrtShapeInferContext *ctx);
  int(OSG_ORT_CALL *GetStartVersion)(const struct OrtCustomOp *op);
  int(OSG_ORT_CALL *GetEndVersion)(const struct OrtCustomOp *op);
  /* Later versions append GetMayInplace, ReleaseMayInplace (18), GetAliasMap, ReleaseAliasMap:
   * never read at version 17. */
};

#define OSG_SLOT(field, index) \
  _Static_assert(offsetof(OrtApi, field) == (index) * sizeof(void *), #field " is not at slot " #index)
OSG_SLOT(CreateStatus, 0);
OSG_SLOT(GetErrorMessage, 2);
OSG_SLOT(CreateCustomOpDomain, 26);
OSG_SLOT(CustomOpDomain_Add, 27);
OSG_SLOT(AddCustomOpDomain, 28);
OSG_SLOT(GetTensorMutableData, 51);
OSG_SLOT(CreateTensorTypeAndShapeInfo, 57);
OSG_SLOT(SetTensorElementType, 58);
OSG_SLOT(SetDimensions, 59);
OSG_SLOT(GetTensorElementType, 60);
OSG_SLOT(GetDimensionsCount, 61);
OSG_SLOT(GetDimensions, 62);
OSG_SLOT(GetSymbolicDimensions, 63);
OSG_SLOT(GetTensorShapeElementCount, 64);
OSG_SLOT(GetTensorTypeAndShape, 65);
OSG_SLOT(KernelInfoGetAttribute_float, 85);
OSG_SLOT(KernelInfoGetAttribute_int64, 86);
OSG_SLOT(KernelContext_GetInputCount, 88);
OSG_SLOT(KernelContext_GetOutputCount, 89);
OSG_SLOT(KernelContext_GetInput, 90);
OSG_SLOT(KernelContext_GetOutput, 91);
OSG_SLOT(ReleaseStatus, 93);
OSG_SLOT(ReleaseTensorTypeAndShapeInfo, 99);
OSG_SLOT(ShapeInferContext_GetInputCount, 267);
OSG_SLOT(ShapeInferContext_GetInputTypeShape, 268);
OSG_SLOT(ShapeInferContext_GetAttribute, 269);
OSG_SLOT(ShapeInferContext_SetOutputTypeShape, 270);
OSG_SLOT(SetSymbolicDimensions, 271);
OSG_SLOT(ReadOpAttr, 272);
OSG_SLOT(KernelContext_ParallelFor, 274);
#undef OSG_SLOT

#ifdef __cplusplus
}
#endif
#endif /* ORTSERVE_ORT_ABI_H */
