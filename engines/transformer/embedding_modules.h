// A sentence-transformers model directory's modules (modules.json, and its Pooling module's
// config.json), as embedding models built on a decoder ship them. warmpool embeds an input as its
// last token's final state at unit length (the Transformer, Pooling with pooling_mode_lasttoken
// and Normalize modules), so a model whose modules ask for anything else — another pooling, a Dense
// projection after it — would embed wrongly without a word: it is refused where the directory is
// read, at registration and at every load, naming what it asks for. A directory without
// modules.json is a plain Hugging Face one, embedded as above. (The directory's version,
// common/file_version.h, covers modules.json and the JSON files of the module folders named as
// sentence-transformers names them, "1_Pooling": a change to the Pooling configuration alone is a
// new version at the next reload. A module folder of another name is seen at the next load.)
#pragma once

#include <string>
#include <vector>

#include "common/file_version.h"
#include "common/status.h"

namespace warmpool::transformer {

// Reads modules.json (optional) through the directory held open as `dir` and, for its Pooling
// module, that module's config.json (one folder down, neither followed through a symlink).
// INVALID_ARGUMENT, naming the file and the key or module, for a pooling other than the last
// token's (the booleans of sentence-transformers before 5.4, or its "pooling_mode" since), no
// Pooling module, a module warmpool does not compute (by its class: the types of either version
// are known), or files that are not JSON as it writes them; NOT_FOUND when the Pooling folder has
// no config.json. `versions` gets the version of every file read.
Status CheckEmbeddingModules(int dir, const std::string& shown, std::vector<FileVersion>* versions);

}  // namespace warmpool::transformer
