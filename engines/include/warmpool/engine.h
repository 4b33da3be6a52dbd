/* warmpool engine ABI, version 14 (engines of versions 2 to 13 keep loading: everything a version
 * added lies at the ends of the structs, and an older engine never reads or writes it).
 *
 * An engine turns a model file into an inference function. Workers call engines through this C ABI
 * so that engines can be built outside this repository and loaded from a configured directory.
 *
 * Memory: an engine never mallocs its weights. It asks the worker's device-memory service for
 * regions; on the host backend a region is a memfd mapping, on CUDA device memory. Regions are
 * shareable (the handle travels to the supervisor), which is why weights must live in them.
 *
 * Threads: the worker calls open/load for one engine instance on its load thread and infer on its
 * serving thread, never both at once for the same instance. Different instances are independent.
 *
 * Shared weights: after load, export_weights names the region holding the weights; the worker
 * passes its handle to the supervisor, which keeps it while the model is resident. A later worker
 * (a respawn after a crash, or a replica) opens the model from the header bytes alone and attaches
 * that region instead of loading: no file read, no copy.
 *
 * Errors: every call returns a wp_status; on failure it writes a NUL-terminated message of at most
 * err_len bytes into err that says what is wrong with the model or the input.
 *
 * Version 3 adds language models: a model may be a directory (spec.directory_fd), and generate
 * answers one request with a stream of chunks (text and token ids) and one result. The engine
 * calls emit once per generated token and stops within that step when emit returns non-zero (the
 * client left, the deadline passed). Its per-sequence memory is declared exactly (info.context,
 * info.kv_bytes_per_token), so that admission counts what the sequences' caches take.
 *
 * Version 4 adds embeddings: embed turns texts into vectors of info.embedding_size floats; and
 * log-probabilities: a generation asked for them (request.logprobs) gives each token's, and the
 * most likely tokens' at that step, in its chunks.
 *
 * Version 5 adds typed tensors: run takes named tensors of any element type (wp_dtype) and shape
 * and gives named tensors back, for models whose inputs are not one f32 matrix (token ids in and
 * logits out, images, strings). An engine states what it takes and gives (tensor_signature); the
 * worker checks every request against that statement before run is called.
 *
 * Version 6 adds tools: a chat may come as one JSON document (request.conversation) holding its
 * messages with their tool calls and answers, and the tools the model may call, for the chat
 * template to render.
 *
 * Version 7 adds continuous batching: a generation may be opened as a sequence (open_sequence),
 * stepped together with the engine's other open sequences (step: one pass of the model for all of
 * them, each getting its next token or its prompt's next piece) and closed (close_sequence) when it
 * ends or its client leaves. Sequences join and leave between any two steps. info.sequences says
 * how many may be open at once (spec.sequences asks for a number).
 *
 * Version 8 adds the prefix cache's count: each step says how many of a sequence's prompt tokens it
 * found in the engine's cache instead of computing them (wp_sequence_step.cached_tokens, in what
 * was that struct's tail padding where pointers are 8 bytes: there arrays of version 7 keep their
 * layout).
 *
 * Version 9 resumes a generation whose worker died mid-stream: the request carries the tokens its
 * client already has (request.resume_tokens), and the engine goes on after them as if it had
 * generated them itself, sending none of them again. The worker resumes only on a version 9
 * engine.
 *
 * Version 10 keeps the KV cache when a worker dies: an engine whose sequences' keys and values lie
 * in memory another process can map says which (export_cache), the worker hands it to the
 * supervisor, and a generation resumed after that worker's death comes with it
 * (request.kv_source): the engine copies the positions it finds there of the prompt and the tokens
 * resumed instead of computing them. kv_usage says how many of its cache's blocks its sequences
 * hold (the daemon's KV-usage gauge).
 *
 * Version 11 keeps the prefix cache when a model is parked and unparked: the supervisor holds on
 * to an instance's exported cache after it closed cleanly, and a later instance of the same weights
 * takes it over as its own (adopt_cache), finding there the prefixes the earlier one kept.
 *
 * Version 12 sizes the KV cache by positions rather than by whole contexts: spec.kv_tokens asks for
 * a cache that holds fewer than sequences x context positions, shared by the open sequences, and
 * open_sequence admits a generation only while the cache has the blocks it may come to need (its
 * prompt and max_tokens, up to the context) beside those the open ones may: otherwise it refuses
 * it (WP_RESOURCE_EXHAUSTED) and says so through kv_reservations (`refused`), and the worker hands
 * it back to the supervisor, which sends it again where room is. A refusal kv_reservations does
 * not name is the client's answer.
 *
 * Version 13 lets an engine admit a generation by less than all it may come to need (its prompt,
 * say) and make room as the open ones grow: a step may end the sequences that arrived last before their end
 * (preempted), their blocks freed for the others; the worker hands each back
 * to the supervisor, which sends it again, resumed after the tokens it sent, where that much room is
 * free (recomputing what the prefix cache no longer keeps).
 *
 * Version 14 lets a model say it embeds but does not generate (info.embeds_only): a language
 * model's checkpoint without an output head, say, as embedding models ship. The supervisor refuses
 * a generation of it at once, without loading it, and lists it as such.
 */
#ifndef WARMPOOL_ENGINE_H_
#define WARMPOOL_ENGINE_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define WP_ENGINE_ABI_VERSION 14u
/* The oldest version workers still load. */
#define WP_ENGINE_ABI_VERSION_MIN 2u

/* Values match warmpool.v1.Code. */
typedef enum wp_status {
  WP_OK = 0,
  WP_NOT_FOUND = 1,
  WP_INVALID_ARGUMENT = 2,
  WP_RESOURCE_EXHAUSTED = 3,
  WP_UNAVAILABLE = 4,
  WP_FAILED_PRECONDITION = 6,
  WP_INTERNAL = 8,
} wp_status;

/* One region of device memory. handle is the shareable handle (a memfd on the host backend), owned
 * by the memory service; ptr is valid in this process until free. */
typedef struct wp_region {
  void* ptr;
  uint64_t bytes;
  int handle;
} wp_region;

typedef struct wp_device_memory {
  void* ctx;
  /* Allocates bytes (> 0) of device memory, zero-filled. WP_RESOURCE_EXHAUSTED when over budget. */
  wp_status (*alloc)(void* ctx, uint64_t bytes, wp_region* out);
  void (*free)(void* ctx, wp_region* region);
  /* 1 when ptr is host-addressable (host backend), 0 when it is device memory. */
  int host_addressable;
  /* Maps a region another process exported (its shareable handle and size). The region is owned
   * by the caller like an allocated one: free releases this mapping only. Other processes map the
   * same bytes: engines never write into an imported region (the host backend maps it read-only
   * and its write refuses it). */
  wp_status (*import)(void* ctx, int handle, uint64_t bytes, wp_region* out);
  /* Copies bytes between host memory and a region, at offset bytes into it; complete when the call
   * returns. On the host backend a memcpy; on CUDA a copy through the driver. Engines that may
   * run on device memory (host_addressable 0) move weights and data only through these. Added
   * after the first release of ABI version 2: older engines never read them. */
  wp_status (*write)(void* ctx, const wp_region* region, uint64_t offset, const void* source, uint64_t bytes);
  wp_status (*read)(void* ctx, const wp_region* region, uint64_t offset, void* destination, uint64_t bytes);
} wp_device_memory;

/* What the worker knows about the model it asks an engine to open. */
typedef struct wp_engine_spec {
  const char* name;  /* registered model name */
  const char* path;  /* model file, may be empty for engines that need none (echo) */
  /* When set, the model's header as read when it was registered: open must take the model's
   * description from these bytes and not touch the file (it may be gone). */
  const uint8_t* header;
  uint64_t header_bytes;
  uint64_t file_size;
  /* Version 3. A model that is a directory (has_directory non-zero): its descriptor, opened by
   * the supervisor beneath its model root and valid during open and load only. The engine reads
   * files beneath it with openat and no path of its own, following no symlink. Never set with
   * header (an attach: the weights region holds what the model needs). */
  int has_directory;
  int directory_fd;
  /* Tokens of context each sequence gets; 0: the engine's default. */
  uint32_t context;
  /* Version 7: generations open at once (info.sequences); 0: the engine's default. */
  uint32_t sequences;
  /* Version 12: positions the KV cache holds in all, shared by the open sequences (info.kv_tokens);
   * 0: sequences x context. */
  uint64_t kv_tokens;
  /* Version 12: how many times a step that only decodes a step carrying prompt tokens beside
   * decoding sequences may take (chunked prefill: the running streams' gaps between tokens stretch
   * by about that much while a prompt goes in); 0: the engine's default. */
  float prefill_stretch;
} wp_engine_spec;

/* Sizes an engine reports after open (from headers only, before any weight is read). */
typedef struct wp_engine_info {
  uint64_t weight_bytes;    /* device bytes load will allocate for weights */
  uint64_t workspace_bytes; /* device bytes for activations at the largest batch (max_batch) */
  uint32_t in_features;     /* 0: any width (echo) */
  uint32_t out_features;    /* 0: same as the input width (echo) */
  uint32_t max_batch;       /* rows per infer call the workspace was sized for */
  /* Version 3: language models (0 for others). workspace_bytes includes the KV cache of
   * sequences x context tokens at kv_bytes_per_token each. */
  uint32_t context;
  uint32_t sequences;
  uint64_t kv_bytes_per_token;
  /* Version 4: floats per embedding (0: the engine does not embed). */
  uint32_t embedding_size;
  /* Version 12: positions its KV cache holds in all (workspace_bytes counts them, not sequences x
   * context); 0 (and any older engine): sequences x context. At least one context: any request the
   * context holds fits once the other sequences close. */
  uint64_t kv_tokens;
  /* Version 14: non-zero when the model embeds (embedding_size > 0) but gives no logits: generate
   * and open_sequence refuse it, and run gives no logits (a checkpoint without an output head). 0
   * (and any older engine): it generates. */
  uint32_t embeds_only;
} wp_engine_info;

/* Version 3: one generation request. Options not set in `set` take the model's defaults
 * (generation_config.json). Strings are UTF-8, not NUL-terminated. */
enum {
  WP_SET_TEMPERATURE = 1u << 0,
  WP_SET_TOP_K = 1u << 1,
  WP_SET_TOP_P = 1u << 2,
  WP_SET_MIN_P = 1u << 3,
  WP_SET_REPETITION_PENALTY = 1u << 4,
  WP_SET_SEED = 1u << 5,
};
typedef struct wp_string {
  const char* data;
  uint64_t bytes;
} wp_string;
typedef struct wp_generate_request {
  wp_string prompt;          /* text, tokenized by the model's tokenizer with its special tokens */
  const int32_t* tokens;     /* ... or token ids, used as they are (token_count > 0) */
  uint64_t token_count;
  uint32_t max_tokens;       /* 0: until an end token or the end of the context */
  uint32_t set;              /* WP_SET_* */
  float temperature;         /* 0: greedy */
  uint32_t top_k;            /* 0: all */
  float top_p;
  float min_p;
  float repetition_penalty;
  uint64_t seed;
  const wp_string* stop;     /* generation ends before the first of these in the text */
  uint32_t stop_count;
  /* ... or a conversation (message_count > 0): roles[i] and contents[i], rendered into the prompt
   * by the model's chat template, ending with the assistant's turn. */
  const wp_string* roles;
  const wp_string* contents;
  uint32_t message_count;
  /* Version 4 (a version 3 engine never reads them): each generated token's log-probability in
   * the chunks (logprobs non-zero), and the top_logprobs (0 to 20) most likely tokens' at each
   * step. Log-probabilities are the model's own: the log-softmax of its logits, before
   * temperature, penalties and filters. */
  uint32_t logprobs;
  uint32_t top_logprobs;
  /* Version 6: instead of roles and contents (message_count 0), the conversation as a JSON object
   * (UTF-8), {"messages": [...], "tools": [...]}: each message as OpenAI's API and Hugging Face's
   * chat templates have it ({"role", "content"}, an assistant's "tool_calls" as [{"id", "type":
   * "function", "function": {"name", "arguments": {...}}}], a tool's "tool_call_id" and "name"),
   * each tool as {"type": "function", "function": {"name", "description", "parameters"}}. The
   * worker passes it only to a version 6 engine. */
  wp_string conversation;
  /* Version 9: a generation resumed after the worker running it died. These are the tokens it had
   * generated, which its client has: the engine computes them with the prompt, counts them as
   * generated (max_tokens, the result's completion_tokens), leaves its sampler where drawing them
   * left it (a seeded draw per sampled token) and its stop strings where their text left them,
   * and emits only what follows them. The worker passes them only to a version 9 engine; one that
   * cannot resume must refuse a request with resume_count > 0 (WP_UNAVAILABLE), never start it
   * again from its prompt: its client would get the text twice. */
  const int32_t* resume_tokens;
  uint32_t resume_count;
  /* Version 10: a region an earlier instance of this model exported (export_cache) and left
   * behind when its worker died, mapped read-only by the engine during open_sequence or generate
   * only (kv_source_bytes 0 and kv_source -1: none); kv_source_bytes is the size export_cache gave
   * (device memory's handle has none of its own: the engine maps it through the memory service's
   * import). The engine takes from it the keys and values of the request's
   * tokens (prompt, then resume_tokens) it finds there, rather than computing them; what it does
   * not find, or a region that is not its model's, it computes as ever. What it copies serves that
   * generation alone (a crashed engine may have left anything there: it joins no prefix cache). */
  int kv_source;
  uint64_t kv_source_bytes;
  /* Version 13: non-zero when the caller can resume this generation after the tokens it emitted
   * (request.resume_tokens): the engine may then admit it by less than all it may come to need and
   * preempt it later (preempted). Zero: it is never preempted, and is
   * admitted by all it may need, as in version 12. */
  uint32_t preemptible;
  /* Version 13: when the request first arrived, in the caller's order (smaller: earlier; 0: as it
   * opens). The latest to arrive is preempted first, so that one resumed after a preemption keeps
   * its place among the others rather than coming back the youngest. */
  uint64_t arrival;
} wp_generate_request;
/* What one step produced: text that never splits a UTF-8 character (empty while a character's
 * bytes are incomplete or may begin a stop string), and the token ids it came from. */
typedef struct wp_logprob {
  int32_t token;
  float logprob;
  wp_string piece; /* the token's bytes (maybe part of a UTF-8 character) */
} wp_logprob;
typedef struct wp_token_logprobs {
  wp_logprob chosen;
  const wp_logprob* top; /* most likely first */
  uint32_t top_count;
} wp_token_logprobs;
typedef struct wp_generate_chunk {
  wp_string text;
  const int32_t* tokens;
  uint32_t token_count;
  /* Version 4, when asked for: one per token of this chunk (read only from a version 4 engine). */
  const wp_token_logprobs* logprobs;
  uint32_t logprob_count;
} wp_generate_chunk;
typedef enum wp_finish_reason {
  WP_FINISH_STOP = 0,      /* an end token or a stop string */
  WP_FINISH_LENGTH = 1,    /* max_tokens, or the context is full */
  WP_FINISH_CANCELLED = 2, /* emit returned non-zero */
} wp_finish_reason;
typedef struct wp_generate_result {
  uint32_t finish_reason; /* wp_finish_reason */
  uint32_t prompt_tokens;
  uint32_t completion_tokens;
} wp_generate_result;
/* Returns non-zero to stop the generation (it then ends WP_FINISH_CANCELLED). A chunk with no text
 * and no tokens is progress (between the pieces of a long prompt, say): nothing is sent for it, but
 * it shows the generation moves and is a point where it can be stopped. */
typedef int (*wp_emit_fn)(void* ctx, const wp_generate_chunk* chunk);
/* Version 7: an open generation (continuous batching). */
typedef struct wp_sequence wp_sequence;
/* One sequence of a step: the caller names it; the engine says how the step left it. */
typedef struct wp_sequence_step {
  wp_sequence* sequence;
  /* Out: non-zero when the sequence ended in this step (then close it). It ended well when status is
   * WP_OK (result says why: an end token, a stop string, the limit), else with that error, and
   * error says what went wrong (NUL-terminated). */
  uint32_t ended;
  wp_status status;
  wp_generate_result result;
  char error[256];
  /* Version 8, out: of result.prompt_tokens (the prompt's), how many the engine found in its cache
   * (kept from an earlier sequence with the same prefix) and did not compute. Set every step. */
  uint32_t cached_tokens;
} wp_sequence_step;
/* A step's output for sequences[index] of the step: called at most once per sequence and step,
 * during the step; the chunk is valid during the call only. */
typedef void (*wp_step_emit_fn)(void* ctx, uint32_t index, const wp_generate_chunk* chunk);

/* Called during load with bytes copied so far; returning non-zero cancels the load. An engine may
 * call it from threads of its own, but never two calls at once, and done_bytes never goes back. */
typedef int (*wp_progress_fn)(void* ctx, uint64_t done_bytes, uint64_t total_bytes);

/* Version 5: element types of typed tensors. Values match warmpool.v1.DType. */
typedef enum wp_dtype {
  WP_DTYPE_F32 = 1,
  WP_DTYPE_F16 = 2,   /* IEEE 754 binary16 */
  WP_DTYPE_BF16 = 3,  /* the upper half of an f32 */
  WP_DTYPE_I32 = 4,
  WP_DTYPE_I64 = 5,
  WP_DTYPE_BYTES = 6, /* each element: a little-endian uint32 length, then that many bytes */
} wp_dtype;
#define WP_TENSOR_MAX_RANK 8
/* A named tensor: its elements little-endian in row-major order. Every size of a request's tensor
 * is >= 0; in a signature a size of -1 means any (the request chooses it). The data a worker passes
 * is aligned to 8 bytes; an engine's outputs need no alignment. */
typedef struct wp_tensor {
  const char* name; /* NUL-terminated UTF-8, 1 to 64 bytes */
  uint32_t dtype;   /* wp_dtype */
  uint32_t rank;    /* sizes used in shape; 0: a scalar (one element) */
  int64_t shape[WP_TENSOR_MAX_RANK];
  const void* data; /* NULL in a signature */
  uint64_t bytes;   /* of data: elements x their size; for BYTES the lengths and bytes together */
} wp_tensor;
/* Takes one output of run; copies what it needs before it returns. A status other than WP_OK
 * refuses it (too large for a reply, say): run then stops and returns that status. */
typedef wp_status (*wp_tensor_sink_fn)(void* ctx, const wp_tensor* output);

typedef struct wp_engine wp_engine; /* opaque engine instance */

typedef struct wp_engine_vtable {
  uint32_t abi_version; /* WP_ENGINE_ABI_VERSION (or an older one down to _MIN) */
  const char* name;     /* "dense", "echo", "transformer" */

  /* Reads and validates the model's metadata (never the weights); fills info. */
  wp_status (*open)(const wp_engine_spec* spec, const wp_device_memory* memory, wp_engine** out,
                    wp_engine_info* info, char* err, size_t err_len);
  /* Allocates device memory through the service and copies the weights into it. */
  wp_status (*load)(wp_engine* engine, wp_progress_fn progress, void* progress_ctx, char* err,
                    size_t err_len);
  /* input: rows x cols row-major f32; output: rows x out_cols, where out_cols is info.out_features
   * (or cols when that is 0). WP_INVALID_ARGUMENT when cols does not match in_features. */
  wp_status (*infer)(wp_engine* engine, const float* input, uint32_t rows, uint32_t cols,
                     float* output, char* err, size_t err_len);
  /* Frees every region and the instance. Safe after a failed open or load. */
  void (*close)(wp_engine* engine);
  /* After load: the region holding the weights. WP_NOT_FOUND when the engine has none (echo). */
  wp_status (*export_weights)(wp_engine* engine, wp_region* out);
  /* Instead of load: use weights already in device memory (an imported region, taken over by the
   * engine). WP_INVALID_ARGUMENT when the region does not fit the model. */
  wp_status (*attach)(wp_engine* engine, const wp_region* weights, char* err, size_t err_len);

  /* Version 3 (NULL where the engine does not do it). */
  /* After an open from a directory: the description it made of the model, which a later open
   * gets back as spec.header to attach without the directory. Valid until close. */
  wp_status (*describe)(wp_engine* engine, const uint8_t** header, uint64_t* header_bytes);
  /* Generates for one request, calling emit per step; result is filled on WP_OK. Prompts that do
   * not fit the context and invalid options are WP_INVALID_ARGUMENT before anything runs. */
  wp_status (*generate)(wp_engine* engine, const wp_generate_request* request, wp_emit_fn emit, void* emit_ctx,
                        wp_generate_result* result, char* err, size_t err_len);

  /* Version 4 (NULL where the engine does not do it). */
  /* Embeds each input (UTF-8 text, tokenized with the model's special tokens) on its own, none
   * attending to another (an engine may run several in one pass, which may change an embedding's
   * last bits): embeddings receives input_count x info.embedding_size floats, input_tokens (unless
   * NULL) the token count of each. Inputs that do not fit the context are WP_INVALID_ARGUMENT, and
   * nothing is written. progress (unless NULL) is called as the work goes, with the tokens run so
   * far of all the inputs' tokens (between inputs or groups of them, and between the pieces of a
   * long one); a non-zero return stops it (WP_UNAVAILABLE, nothing written). */
  wp_status (*embed)(wp_engine* engine, const wp_string* inputs, uint32_t input_count, float* embeddings,
                     uint32_t* input_tokens, wp_progress_fn progress, void* progress_ctx, char* err,
                     size_t err_len);

  /* Version 5 (NULL where the engine does not do it). */
  /* After open: the inputs run takes and the outputs it gives (data NULL; -1 for sizes any
   * request chooses), valid until close. A request's inputs are exactly these names, each of this
   * dtype and rank and of these sizes where they are not -1; the worker refuses any other before
   * run. NULL here (with run set): the engine takes any well-formed tensors and checks them itself. */
  wp_status (*tensor_signature)(wp_engine* engine, const wp_tensor** inputs, uint32_t* input_count,
                                const wp_tensor** outputs, uint32_t* output_count);
  /* Runs one request of typed tensors (well-formed: sizes and bytes agree, BYTES elements whole),
   * calling sink once per output. Inputs the engine cannot use are WP_INVALID_ARGUMENT. Outputs of
   * more than max_output_bytes in all (their data; 0: no bound) cannot be answered: an engine that
   * knows its outputs' sizes from the inputs refuses such a request (WP_RESOURCE_EXHAUSTED) before
   * it computes or allocates anything. A run that takes long calls progress (unless NULL) as it
   * goes, as embed does (the work done so far of the total, in any unit); a non-zero return stops
   * it (WP_UNAVAILABLE). The worker judges a run by that progress, as it does a generation: one
   * that says nothing for the stall limit ([recovery] load_stall_ms, 30 s) is taken for hung. */
  wp_status (*run)(wp_engine* engine, const wp_tensor* inputs, uint32_t input_count, uint64_t max_output_bytes,
                   wp_tensor_sink_fn sink, void* sink_ctx, wp_progress_fn progress, void* progress_ctx, char* err,
                   size_t err_len);
  /* Version 7 (NULL where the engine does not do it; all three or none). */
  /* Opens a generation: the request checked (as generate checks it: WP_INVALID_ARGUMENT) and
   * tokenized, nothing run yet; prompt_tokens (unless NULL) gets its prompt's length.
   * WP_RESOURCE_EXHAUSTED when info.sequences are open already, or (version 12) when its KV cache
   * has not the blocks this generation may come to need beside those the open sequences may: then
   * kv_reservations names the refusal, and the worker tries it again once one has closed (any
   * other refusal is the request's answer). The request need not outlive the call. */
  wp_status (*open_sequence)(wp_engine* engine, const wp_generate_request* request, wp_sequence** out,
                             uint32_t* prompt_tokens, char* err, size_t err_len);
  /* One step of these open sequences (each at most once, none ended): every one advances by its
   * next token or its prompt's next piece, or, when the step carries other prompts' pieces, waits
   * for a later step (a prompt may sit out a step; a decoding sequence never does). Each sequence's
   * output goes to emit; how the step left it, into its wp_sequence_step. A failure of the whole
   * pass (not of one sequence) is returned, and then no sequence advanced. */
  wp_status (*step)(wp_engine* engine, wp_sequence_step* sequences, uint32_t count, wp_step_emit_fn emit,
                    void* emit_ctx, char* err, size_t err_len);
  /* Ends a sequence, whether it ended or not (its client left): its memory is free for another. */
  void (*close_sequence)(wp_engine* engine, wp_sequence* sequence);

  /* Version 10 (NULL where the engine does not do it). */
  /* After load, attach or unpark: the region (its handle and size; ptr need not be set for host
   * memory) holding the sequences' keys and values with the records a later instance reads them
   * by (request.kv_source), valid until close: host memory, or device memory from the memory
   * service (alloc, the region as it gave it: the worker finds the grant behind it by ptr), whose
   * handle the supervisor then holds as it holds the weights'. WP_NOT_FOUND when the engine keeps them
   * where no other process can map them. */
  wp_status (*export_cache)(wp_engine* engine, wp_region* out);
  /* Its KV cache's blocks now: those its open sequences (and a run, an embedding) hold, of all it
   * has; blocks that only keep a prefix for later requests are free for the taking, not held.
   * WP_NOT_FOUND when it keeps no cache in blocks. Called between steps, on the serving thread. */
  wp_status (*kv_usage)(wp_engine* engine, uint64_t* blocks_held, uint64_t* blocks);

  /* Version 11 (NULL where the engine does not do it). */
  /* Before any sequence opens, after load, attach or unpark: the cache an earlier instance of these
   * very weights exported (export_cache) and left when it closed cleanly (handle and bytes; ptr
   * unset) — where that was device memory, a host copy of it the worker made when the model
   * parked, laid out alike — taken over as this instance's own: its keys and values and what they
   * are the keys and values of serve this one's prefix cache. A cache in host memory becomes this
   * instance's, export_cache names it from now on and the engine keeps a descriptor of its own; a
   * host copy of device memory is written into this instance's own region, which export_cache
   * still names (the caller closes the handle either way). An error leaves the engine with
   * the cache it had (empty, before any sequence): WP_INVALID_ARGUMENT for a region that is not a
   * cache this model could have made, WP_FAILED_PRECONDITION while a sequence is open or where the
   * engine keeps no cache another process can map. */
  wp_status (*adopt_cache)(wp_engine* engine, const wp_region* cache, char* err, size_t err_len);

  /* Version 12 (NULL where the engine does not do it). */
  /* Blocks of its KV cache (of kv_usage's `blocks`) that its open sequences may come to need, held
   * already or not (reserved): a generation that may need more than the rest is refused by
   * open_sequence; and, when the last open_sequence call refused its generation for want of that
   * room, the blocks it would have needed (refused; 0 after any other outcome: only a refusal that
   * says so is handed back to wait for room). WP_NOT_FOUND when it reserves nothing. Called on the
   * serving thread. */
  wp_status (*kv_reservations)(wp_engine* engine, uint64_t* reserved, uint64_t* refused);

  /* Version 13 (NULL where the engine does not do it). */
  /* After a step that ended this sequence (its wp_sequence_step ended, status WP_RESOURCE_EXHAUSTED):
   * non-zero when the engine ended it before its end to make room in its KV cache for older ones
   * (it was opened preemptible): the blocks it needs to go on. Nothing of that step was emitted for
   * it, and its blocks are free already; the caller closes it and opens it again, resumed after the
   * tokens it emitted (request.resume_tokens), once that much room is free. 0 otherwise. */
  uint32_t (*preempted)(wp_engine* engine, const wp_sequence* sequence);
} wp_engine_vtable;

/* Built-in engines. A plugin exports `const wp_engine_vtable* warmpool_engine(void)`. */
const wp_engine_vtable* warmpool_engine_dense(void);
const wp_engine_vtable* warmpool_engine_echo(void);
const wp_engine_vtable* warmpool_engine_transformer(void);

#ifdef __cplusplus
}
#endif

#endif /* WARMPOOL_ENGINE_H_ */
