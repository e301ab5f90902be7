/*
 * commcamp's own declarations of the NCCL/RCCL tuner-plugin ABI.
 *
 * Written from the interface documentation in NVIDIA/nccl (no NCCL header is included or
 * needed at build time). Sources read, per item:
 *   [N-V2..V6] src/include/plugin/tuner/tuner_v{2,3,4,5,6}.h      (v2..v5 at tag v2.28.3-1, v6 at v2.30.7-1)
 *   [N-V7]     src/include/plugin/tuner/tuner_v7.h, src/plugin/tuner/tuner_v7.cc (NVIDIA/nccl commit
 *              2449986f, after v2.30.7-1; NCCL 2.32 per commcamp issue 13: dlsym "ncclTunerPlugin_v7")
 *   [N-TUN]    src/include/plugin/nccl_tuner.h                    (algorithm/protocol indices, IGNORE marker)
 *   [N-COM]    ext-tuner/example/nccl/common.h, err.h (v2.28.3-1) (logger type, log levels, subsystems, results)
 *   [N-ENQ]    src/enqueue.cc (v2.28.3-1) lines 1758-1765, 1901-1957 (cost table layout, nChannels in/out)
 *   [N-LOAD]   src/plugin/tuner.cc (v2.28.3-1) lines 72-81; (v2.30.7-1) v6 first (symbol names, search order)
 *   [R-V5]     ROCm/rccl src/include/plugin/tuner/tuner_v5.h       (same function signatures as NCCL's v5)
 *
 * Which NCCL looks for which symbol (first found wins, newest first):
 *   2.19-2.20 ncclTunerPlugin_v1 (not provided: v1 has no per-communicator context)
 *   2.21      ncclTunerPlugin_v2
 *   2.22-2.23 ncclTunerPlugin_v3, then v2
 *   2.24-2.27 ncclTunerPlugin_v4, then v3, v2
 *   2.28-2.29 ncclTunerPlugin_v5, then v4, v3, v2
 *   2.30-2.31 ncclTunerPlugin_v6, then v5 ... v2
 *   2.32+     ncclTunerPlugin_v7, then v6 ... v2
 */
#ifndef COMMCAMP_TUNER_API_H
#define COMMCAMP_TUNER_API_H

#include <stddef.h>
#include <stdint.h>

/* Return codes [N-COM err.h]. */
typedef enum {
  CC_NCCL_SUCCESS = 0,
  CC_NCCL_SYSTEM_ERROR = 2,
  CC_NCCL_INTERNAL_ERROR = 3,
  CC_NCCL_INVALID_ARGUMENT = 4,
} cc_nccl_result_t;

/* Logger levels and subsystem flags [N-COM common.h]. */
typedef enum {
  CC_NCCL_LOG_NONE = 0,
  CC_NCCL_LOG_VERSION = 1,
  CC_NCCL_LOG_WARN = 2,
  CC_NCCL_LOG_INFO = 3,
  CC_NCCL_LOG_ABORT = 4,
  CC_NCCL_LOG_TRACE = 5,
} cc_nccl_log_level_t;

#define CC_NCCL_SUBSYS_INIT 0x1UL
#define CC_NCCL_SUBSYS_TUNING 0x40UL

/* NCCL passes its own ncclDebugLog here; printf-style [N-COM common.h]. */
typedef void (*cc_nccl_logger_t)(cc_nccl_log_level_t level, unsigned long flags, const char* file, int line,
                                 const char* fmt, ...);

/* Collective ids (ncclFunc_t); NCCL 2.28 also defines send/recv/alltoall/... above 4, which the
 * tuner may receive but no config line can name [N-COM tuner.h, nccl_common.h]. */
typedef enum {
  CC_NCCL_FUNC_BROADCAST = 0,
  CC_NCCL_FUNC_REDUCE = 1,
  CC_NCCL_FUNC_ALLGATHER = 2,
  CC_NCCL_FUNC_REDUCESCATTER = 3,
  CC_NCCL_FUNC_ALLREDUCE = 4,
} cc_nccl_func_t;
#define CC_NCCL_NUM_TUNABLE_FUNCS 5

/* Cost-table row (algorithm) and column (protocol) indices [N-TUN]. PAT exists from NCCL 2.23. */
enum {
  CC_NCCL_ALGO_TREE = 0,
  CC_NCCL_ALGO_RING = 1,
  CC_NCCL_ALGO_COLLNET_DIRECT = 2,
  CC_NCCL_ALGO_COLLNET_CHAIN = 3,
  CC_NCCL_ALGO_NVLS = 4,
  CC_NCCL_ALGO_NVLS_TREE = 5,
  CC_NCCL_ALGO_PAT = 6,
  CC_NCCL_NUM_ALGORITHMS = 7,
};
enum {
  CC_NCCL_PROTO_LL = 0,
  CC_NCCL_PROTO_LL128 = 1,
  CC_NCCL_PROTO_SIMPLE = 2,
  CC_NCCL_NUM_PROTOCOLS = 3,
};
#define CC_NCCL_ALGO_UNDEF (-1)
#define CC_NCCL_PROTO_UNDEF (-1)

/* NCCL marks combinations it will not run with this cost [N-TUN]; its selector also skips any
 * negative cost [N-ENQ topoGetAlgoInfo: "table[a][p] >= 0.0"]. */
#define CC_NCCL_ALGO_PROTO_IGNORE (-1.0f)

/* Highest channel count NCCL 2.28 can use (MAXCHANNELS in src/include/device.h:86). */
#define CC_NCCL_MAX_CHANNELS 64

/*
 * The cost table. The prototypes say `float** collCostTable`, but NCCL passes the address of a
 * contiguous `float table[numAlgo][numProto]` cast to float** [N-ENQ 1916-1928]: it must be read
 * as rows of numProto floats, never dereferenced as an array of row pointers.
 *
 * *nChannels on input is 0, meaning "NCCL chooses"; a non-zero value written by the plugin
 * replaces NCCL's channel count for that collective [N-ENQ 1915, 1956].
 */

/* v5/v6 init extras. commcamp never reads or writes them, so they stay opaque: their layouts
 * differ between NCCL and RCCL (RCCL's constants add bwRatio [R-V5]). */
struct cc_nccl_nvl_domain_info;
struct cc_nccl_tuner_constants;

/* v2 [N-V2]: no cost table; the plugin returns algorithm/protocol indices itself. */
typedef struct {
  const char* name;
  cc_nccl_result_t (*init)(size_t nRanks, size_t nNodes, cc_nccl_logger_t logFunction, void** context);
  cc_nccl_result_t (*getCollInfo)(void* context, cc_nccl_func_t collType, size_t nBytes, int collNetSupport,
                                  int nvlsSupport, int numPipeOps, int* algorithm, int* protocol, int* nChannels);
  cc_nccl_result_t (*destroy)(void* context);
} cc_nccl_tuner_v2_t;

/* v3 [N-V3]: cost table in/out, no regBuff. */
typedef struct {
  const char* name;
  cc_nccl_result_t (*init)(size_t nRanks, size_t nNodes, cc_nccl_logger_t logFunction, void** context);
  cc_nccl_result_t (*getCollInfo)(void* context, cc_nccl_func_t collType, size_t nBytes, int numPipeOps,
                                  float** collCostTable, int numAlgo, int numProto, int* nChannels);
  cc_nccl_result_t (*destroy)(void* context);
} cc_nccl_tuner_v3_t;

/* getCollInfo of v4, v5 and v6 [N-V4, N-V5, N-V6]: v3 plus regBuff (1 = user buffers registered). */
typedef cc_nccl_result_t (*cc_nccl_get_coll_info_v4_fn)(void* context, cc_nccl_func_t collType, size_t nBytes,
                                                        int numPipeOps, float** collCostTable, int numAlgo,
                                                        int numProto, int regBuff, int* nChannels);

/* v4 [N-V4]. */
typedef struct {
  const char* name;
  cc_nccl_result_t (*init)(size_t nRanks, size_t nNodes, cc_nccl_logger_t logFunction, void** context);
  cc_nccl_get_coll_info_v4_fn getCollInfo;
  cc_nccl_result_t (*destroy)(void* context);
} cc_nccl_tuner_v4_t;

/* init of v5 and v6: context comes first, plus commId, NVL-domain info and the tunable
 * constants (in/out) [N-V5, N-V6]. */
typedef cc_nccl_result_t (*cc_nccl_init_v5_fn)(void** context, uint64_t commId, size_t nRanks, size_t nNodes,
                                               cc_nccl_logger_t logFunction,
                                               struct cc_nccl_nvl_domain_info* nvlDomainInfo,
                                               struct cc_nccl_tuner_constants* constants);

/* v5 [N-V5]: destroy is called finalize. */
typedef struct {
  const char* name;
  cc_nccl_init_v5_fn init;
  cc_nccl_get_coll_info_v4_fn getCollInfo;
  cc_nccl_result_t (*finalize)(void* context);
} cc_nccl_tuner_v5_t;

/* v6 [N-V6]: v5 plus an optional chunk-size hook; NULL means "use NCCL's chunk size"
 * (NCCL 2.30.7 src/enqueue.cc:2308 checks for NULL). */
typedef struct {
  const char* name;
  cc_nccl_init_v5_fn init;
  cc_nccl_get_coll_info_v4_fn getCollInfo;
  cc_nccl_result_t (*finalize)(void* context);
  cc_nccl_result_t (*getChunkSize)(void* context, cc_nccl_func_t collType, size_t nBytes, int algo, int proto,
                                   int nChannels, size_t* chunkSize);
} cc_nccl_tuner_v6_t;

/* v7 [N-V7]: the functions of v6 with the same signatures; only the constants behind init's
 * `constants` changed (ncclTunerConstants_v7_t: NCCL_NUM_COMPCAPS_V7 = 5 rows of per-capability
 * bandwidths), which commcamp never reads or writes. */
typedef cc_nccl_tuner_v6_t cc_nccl_tuner_v7_t;

#endif /* COMMCAMP_TUNER_API_H */
