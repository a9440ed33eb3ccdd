// Fake of CANN's acl/acl_mdl.h: graph capture of a stream (aclmdlRI), with the real names, values and signatures
// (acl_mdl.h of Ascend/pytorch third_party/acl/inc at c4840e3c: :57, :222-232, :677, :698, :1574-1595).
#ifndef HP_FAKE_ACL_ACL_MDL_H_
#define HP_FAKE_ACL_ACL_MDL_H_

#include "acl/acl_base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef void *aclmdlRI;

typedef enum {
  ACL_MODEL_RI_CAPTURE_MODE_GLOBAL = 0,
  ACL_MODEL_RI_CAPTURE_MODE_THREAD_LOCAL,
  ACL_MODEL_RI_CAPTURE_MODE_RELAXED,
} aclmdlRICaptureMode;

typedef enum {
  ACL_MODEL_RI_CAPTURE_STATUS_NONE = 0,
  ACL_MODEL_RI_CAPTURE_STATUS_ACTIVE,
  ACL_MODEL_RI_CAPTURE_STATUS_INVALIDATED,
} aclmdlRICaptureStatus;

// Runs a captured model on `stream` (one task); destroys it.
aclError aclmdlRIExecuteAsync(aclmdlRI modelRI, aclrtStream stream);
aclError aclmdlRIDestroy(aclmdlRI modelRI);

// Between Begin and End, what is enqueued on `stream` is recorded into a model instead of running. While it is, a
// synchronization of `stream` fails with ACL_ERROR_RT_STREAM_CAPTURED and a blocking aclrtMemcpy of the capturing
// process (GLOBAL or THREAD_LOCAL mode) with ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT; either invalidates the capture,
// and End then fails with ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED.
aclError aclmdlRICaptureBegin(aclrtStream stream, aclmdlRICaptureMode mode);
aclError aclmdlRICaptureGetInfo(aclrtStream stream, aclmdlRICaptureStatus *status, aclmdlRI *modelRI);
aclError aclmdlRICaptureEnd(aclrtStream stream, aclmdlRI *modelRI);

#ifdef __cplusplus
}
#endif

#endif  // HP_FAKE_ACL_ACL_MDL_H_
