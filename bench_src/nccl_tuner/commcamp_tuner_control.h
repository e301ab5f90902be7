/*
 * Control entry points of libnccl-tuner-commcamp.so for the process NCCL runs in (commbench
 * --selections): force one (algorithm, protocol, channels) for every following collective call,
 * and count the calls where NCCL let it apply and those where NCCL had it disabled (then the call
 * runs NCCL's own choice and is counted, never silently replaced). C and C++ (commbench's ccl.cu).
 */
#ifndef COMMCAMP_TUNER_CONTROL_H
#define COMMCAMP_TUNER_CONTROL_H

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

/* Config-file and selection spellings of NCCL's algorithm and protocol ids (commcamp_tuner_api.h). */
#define COMMCAMP_TUNER_ALGORITHM_NAMES {"tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat"}
#define COMMCAMP_TUNER_PROTOCOL_NAMES {"ll", "ll128", "simple"}

/* int commcampTunerForce(int algorithm, int protocol, int channels): algorithm and protocol are
 * NCCL's ids, channels 1..64 or -1 for NCCL's count; algorithm -1 ends forcing (the config rules
 * apply again). Resets the counters. Returns 0, or -1 for ids or channels out of range. */
#define COMMCAMP_TUNER_FORCE_SYMBOL "commcampTunerForce"
typedef int (*commcamp_tuner_force_fn)(int algorithm, int protocol, int channels);
/* int commcampTunerStats(unsigned long long* applied, unsigned long long* unavailable): calls since
 * the last commcampTunerForce where the forced choice was applied / was disabled by NCCL. */
#define COMMCAMP_TUNER_STATS_SYMBOL "commcampTunerStats"
typedef int (*commcamp_tuner_stats_fn)(unsigned long long* applied, unsigned long long* unavailable);
/* int commcampTunerScope(unsigned long long* nodes, unsigned long long* ranks): nNodes and nRanks NCCL
 * gave the communicator of the last call the forced choice applied to (what a config rule must name);
 * -1 when none applied since the last commcampTunerForce. Optional: NULL in plugins before it. */
#define COMMCAMP_TUNER_SCOPE_SYMBOL "commcampTunerScope"
typedef int (*commcamp_tuner_scope_fn)(unsigned long long* nodes, unsigned long long* ranks);

struct commcamp_tuner_control {
  void* lib;
  commcamp_tuner_force_fn force;
  commcamp_tuner_stats_fn stats;
  commcamp_tuner_scope_fn scope;
};

/*
 * Finds the tuner plugin already loaded in this process without loading it (dlopen RTLD_NOLOAD,
 * then dlsym), by the name NCCL loads it under: `plugin` is NCCL_TUNER_PLUGIN's value (a path or
 * .so file name as given, else libnccl-tuner-<plugin>.so, then RCCL's librccl-tuner-<plugin>.so);
 * NULL or "" means NCCL's default libnccl-tuner.so. Returns 0, or -1 with the reason in err.
 */
static inline int commcamp_tuner_control_find(const char* plugin, struct commcamp_tuner_control* out, char* err,
                                              size_t errlen) {
  char names[2][512];
  int n = 0;
  memset(out, 0, sizeof *out);
  if (plugin == NULL || plugin[0] == '\0') {
    snprintf(names[n++], sizeof names[0], "libnccl-tuner.so");
  } else if (strchr(plugin, '/') != NULL || strstr(plugin, ".so") != NULL) {
    snprintf(names[n++], sizeof names[0], "%.480s", plugin);
  } else {
    snprintf(names[n++], sizeof names[0], "libnccl-tuner-%.480s.so", plugin);
    snprintf(names[n++], sizeof names[0], "librccl-tuner-%.480s.so", plugin);
  }
  for (int i = 0; i < n && out->lib == NULL; i++) out->lib = dlopen(names[i], RTLD_NOW | RTLD_NOLOAD);
  if (out->lib == NULL) {
    snprintf(err, errlen, "no tuner plugin %.200s is loaded in this process (NCCL_TUNER_PLUGIN=%.200s)", names[0],
             plugin ? plugin : "");
    return -1;
  }
  out->force = (commcamp_tuner_force_fn)dlsym(out->lib, COMMCAMP_TUNER_FORCE_SYMBOL);
  out->stats = (commcamp_tuner_stats_fn)dlsym(out->lib, COMMCAMP_TUNER_STATS_SYMBOL);
  out->scope = (commcamp_tuner_scope_fn)dlsym(out->lib, COMMCAMP_TUNER_SCOPE_SYMBOL);
  if (out->force == NULL || out->stats == NULL) {
    snprintf(err, errlen, "the loaded tuner plugin %.200s is not commcamp's (no %s)", names[0],
             COMMCAMP_TUNER_FORCE_SYMBOL);
    dlclose(out->lib);
    memset(out, 0, sizeof *out);
    return -1;
  }
  return 0;
}

/* Drops the reference commcamp_tuner_control_find took (the plugin stays loaded by NCCL). */
static inline void commcamp_tuner_control_release(struct commcamp_tuner_control* control) {
  if (control->lib != NULL) dlclose(control->lib);
  memset(control, 0, sizeof *control);
}

#endif /* COMMCAMP_TUNER_CONTROL_H */
