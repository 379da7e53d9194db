/*************************************************************************
 * Stand-in nccl.h (provisioner testbed) for libnccl-dev @VERSION@.
 * Carries the real version macros only; there is no NCCL API behind them.
 ************************************************************************/

#ifndef NCCL_H_
#define NCCL_H_

#define NCCL_MAJOR 2
#define NCCL_MINOR 27
#define NCCL_PATCH 7
#define NCCL_SUFFIX ""

#define NCCL_VERSION_CODE 22707
#define NCCL_VERSION(X,Y,Z) (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z) : (X) * 10000 + (Y) * 100 + (Z))

#endif // end include guard
