// The trainer's checkpoints: the model's fingerprint, the ranks' agreement,
// gathering sharded experts, writing a checkpoint, and checking and loading
// one to resume from.
#include "worker/train/trainer_run.h"

namespace tally::train::internal {
namespace {

// "k1=v1 k2=v2 ..." (Fingerprint()) as ordered pairs.
std::vector<std::pair<std::string, std::string>> FingerprintFields(const std::string& f) {
  std::vector<std::pair<std::string, std::string>> out;
  for (absl::string_view part : absl::StrSplit(f, ' ', absl::SkipEmpty())) {
    const size_t eq = part.find('=');
    out.emplace_back(std::string(part.substr(0, eq)),
                     eq == absl::string_view::npos ? "" : std::string(part.substr(eq + 1)));
  }
  return out;
}

bool AllFinite(const at::Tensor& t) { return at::isfinite(t).all().item<bool>(); }

}  // namespace

std::string Run::Fingerprint() const {
  return absl::StrCat(
      "layers=", c_.model.num_layers, " d_model=", c_.model.d_model, " heads=", c_.model.num_heads,
      " d_ff=", model_->config().d_ff, " vocab=", model_->config().vocab_size,
      " seq_len=", c_.data.seq_len, " packing=", data::PackingModeName(c_.data.packing),
      " seed=", c_.seed,
      c_.model.moe.num_experts > 0
          ? absl::StrCat(" moe=", c_.model.moe.num_experts, "x", c_.model.moe.top_k, "/every",
                         c_.model.moe.every_n_layers, c_.model.moe.shared_expert ? "/shared" : "",
                         c_.model.moe.sigmoid_router ? "/sigmoid" : "/softmax", "/cap",
                         c_.model.moe.capacity_factor)
          : "",
      c_.fp8 ? absl::StrCat(" fp8=", precision::RecipeName(c_.fp8_recipe.recipe), "/",
                            c_.fp8_recipe.history_len, "/", c_.fp8_recipe.margin)
             : "",
      // QAT trains another function of the weights: a run resumes only as
      // the one it was.
      c_.qat ? absl::StrCat(" qat=", model::GgmlQuantName(c_.qat->format), "/",
                            model::QuantLayersName(c_.qat->layers))
             : "");
}


absl::Status Run::CheckParametersAgree() {
  if (!group_) return absl::OkStatus();
  at::NoGradGuard no_grad;
  auto& params = model_->parameters();
  // Each parameter's sum and sum of squares, in FP64 on the host; the
  // maximum over ranks of (x, -x) is (x, -x) again only when all agree.
  // Sharded experts differ by design.
  std::vector<size_t> checked;
  std::vector<at::Tensor> parts;
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].sharded) continue;
    checked.push_back(i);
    at::Tensor v = params[i].value.detach().to(at::kDouble);
    parts.push_back(v.sum().reshape({1}));
    parts.push_back(v.square().sum().reshape({1}));
  }
  at::Tensor x = at::cat(parts).cpu();
  at::Tensor both = at::cat({x, -x});
  group_->AllReduceMax(both);
  const int64_t n = x.numel();
  const at::Tensor hi = both.narrow(0, 0, n), lo = -both.narrow(0, n, n);
  const at::Tensor differ = hi.ne(lo).nonzero();
  if (differ.numel() == 0) return absl::OkStatus();
  const int64_t i = differ[0][0].item<int64_t>();
  return absl::FailedPreconditionError(absl::StrCat(
      "parameter ", params[checked[i / 2]].name, " differs between ranks at step ", state_.step,
      " (", i % 2 ? "sum of squares" : "sum", " from ", lo[i].item<double>(), " to ",
      hi[i].item<double>(), ")"));
}

std::map<size_t, std::array<at::Tensor, 3>> Run::GatherShards() {
  std::map<size_t, std::array<at::Tensor, 3>> whole;
  auto& params = model_->parameters();
  std::vector<size_t> sharded;
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].sharded) sharded.push_back(i);
  }
  if (sharded.empty() || !group_) return whole;
  at::NoGradGuard no_grad;
  const int W = c_.parallel.world_size;
  auto local = [&](size_t i, int k) -> at::Tensor {  // value, m, v
    return k == 0 ? params[i].value.detach() : k == 1 ? opt_->m()[i] : opt_->v()[i];
  };
  // Only rank 0, which writes the checkpoint, assembles the whole tensors,
  // in host memory; the others hold one extra block at a time.
  if (lead()) {
    for (size_t i : sharded) {
      for (int k = 0; k < 3; ++k) {
        const at::Tensor t = local(i, k);
        std::vector<int64_t> shape = t.sizes().vec();
        shape[0] *= W;
        whole[i][k] = at::empty(shape, t.options().device(at::kCPU));
      }
    }
  }
  // Each rank's blocks in turn, from that rank to all.
  for (int j = 0; j < W; ++j) {
    for (size_t i : sharded) {
      for (int k = 0; k < 3; ++k) {
        const at::Tensor t = local(i, k);
        at::Tensor block = j == c_.parallel.rank ? t : at::empty_like(t);  // the root only sends
        group_->Broadcast({block}, j);
        if (lead()) whole[i][k].narrow(0, j * t.size(0), t.size(0)).copy_(block);
      }
    }
  }
  return whole;
}

absl::Status Run::SaveCheckpoint(const std::map<size_t, std::array<at::Tensor, 3>>& whole) {
  std::error_code ec;
  std::filesystem::create_directories(c_.checkpoint_dir, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("cannot create ", c_.checkpoint_dir, ": ", ec.message()));
  }
  // tally-worker: never into a job folder that is a symlink (it could lead
  // into another job's folder, or anywhere).
  const bool confined = !c_.checkpoint_root.empty();
  if (confined) RETURN_IF_ERROR(CheckCheckpointFolder(c_.checkpoint_dir, c_.checkpoint_root));
  const std::string name = absl::StrFormat("step-%08d.ckpt", state_.step);
  const std::string path = absl::StrCat(c_.checkpoint_dir, "/", name);
  CheckpointData data;
  nlohmann::json meta = CheckpointMetadata(state_, opt_->step(), rows_->cursor(), Fingerprint());
  meta["model"] = ModelConfigJson(model_->config());
  meta["seq_len"] = c_.data.seq_len;
  meta["tokenizer"] = TokenizerJson();
  // What a GGUF export quantizes by default (tally-export --format=gguf).
  if (c_.qat) {
    meta["qat"] = {{"format", model::GgmlQuantName(c_.qat->format)},
                   {"layers", model::QuantLayersName(c_.qat->layers)}};
  }
  if (init_from_json_.is_object()) meta["init_from"] = init_from_json_;
  data.metadata_json = meta.dump();
  auto& params = model_->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    // Checkpoints hold the whole model: any world size resumes from them.
    auto it = whole.find(i);
    const bool w = it != whole.end();
    data.tensors.emplace_back("model." + params[i].name, w ? it->second[0] : params[i].value);
    data.tensors.emplace_back("adamw.m." + params[i].name, w ? it->second[1] : opt_->m()[i]);
    data.tensors.emplace_back("adamw.v." + params[i].name, w ? it->second[2] : opt_->v()[i]);
  }
  if (fp8_) {
    for (auto& t : fp8_->State()) data.tensors.push_back(std::move(t));
  }
  for (const auto& [layer, bias] : model_->expert_biases()) {
    data.tensors.emplace_back(absl::StrCat("moe.layers.", layer, ".bias"), bias);
  }
  auto sha = WriteCheckpoint(path, data);
  if (!sha.ok()) return sha.status();
  // After the checkpoint is in place: a sidecar never vouches for a file
  // that is not there yet.
  RETURN_IF_ERROR(WriteChecksumFile(path, *sha));
  std::string reported = path;
  if (confined) {
    ASSIGN_OR_RETURN(reported,
                     ResolvedCheckpointPath(c_.checkpoint_dir, name, c_.checkpoint_root));
  }
  events_->OnCheckpoint({state_.step, state_.tokens, reported, *sha});  // rank 0 only
  return absl::OkStatus();
}

bool IsCheckpointDamage(const absl::Status& s) {
  return s.code() == absl::StatusCode::kNotFound || s.code() == absl::StatusCode::kDataLoss ||
         s.code() == absl::StatusCode::kInvalidArgument;
}

absl::Status Run::CheckFingerprint(const std::string& theirs) const {
  const std::string ours = Fingerprint();
  if (theirs == ours) return absl::OkStatus();
  const auto a = FingerprintFields(theirs), b = FingerprintFields(ours);
  std::map<std::string, std::string> in_theirs(a.begin(), a.end());
  std::map<std::string, std::string> in_ours(b.begin(), b.end());
  std::string what;
  for (const auto& [key, value] : b) {
    auto it = in_theirs.find(key);
    if (it == in_theirs.end() || it->second != value) {
      what = absl::StrCat(key, " is ", it == in_theirs.end() ? "unset" : it->second,
                          " there and ", value, " in this job's spec");
      break;
    }
  }
  if (what.empty()) {
    for (const auto& [key, value] : a) {
      if (!in_ours.count(key)) {
        what = absl::StrCat(key, " is ", value, " there and unset in this job's spec");
        break;
      }
    }
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "was written for a different job", what.empty() ? "" : ": ", what, " (checkpoint: ", theirs,
      "; this job: ", ours, ")"));
}

absl::Status Run::CheckCheckpoint(const nlohmann::json& meta,
                                  const std::map<std::string, at::Tensor>& tensors) {
  auto invalid = [](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat(parts...));
  };
  auto mismatch = [](auto&&... parts) {
    return absl::FailedPreconditionError(absl::StrCat(parts...));
  };
  if (!meta.is_object()) return invalid("metadata is not a JSON object");
  const auto fp = meta.find("fingerprint");
  if (fp == meta.end() || !fp->is_string()) {
    return invalid("metadata field fingerprint is missing or not a string");
  }
  RETURN_IF_ERROR(CheckFingerprint(fp->get<std::string>()));
  if (auto tok = meta.find("tokenizer"); tok != meta.end()) {
    if (!tok->is_object()) return invalid("metadata field tokenizer is not an object");
    RETURN_IF_ERROR(CheckTokenizer(*tok, "the checkpoint"));
  }

  ASSIGN_OR_RETURN(const int64_t step, MetadataInt(meta, "step"));
  ASSIGN_OR_RETURN(const int64_t tokens, MetadataInt(meta, "tokens"));
  ASSIGN_OR_RETURN(const int64_t padding, MetadataInt(meta, "padding_tokens"));
  ASSIGN_OR_RETURN(const int64_t opt_step, MetadataInt(meta, "optimizer_step"));
  ASSIGN_OR_RETURN(const int64_t epoch, MetadataInt(meta, "cursor_epoch"));
  ASSIGN_OR_RETURN(const int64_t row, MetadataInt(meta, "cursor_row"));
  if (step < 0) return invalid("step is ", step, " (expected >= 0)");
  if (step > c_.max_steps) {
    return mismatch("step is ", step, ", past this job's training.max_steps (", c_.max_steps,
                    ")");
  }
  if (opt_step < 0 || opt_step > step) {
    return invalid("optimizer_step is ", opt_step, " (expected between 0 and step, ", step, ")");
  }
  if (tokens < 0) return invalid("tokens is ", tokens, " (expected >= 0)");
  if (padding < 0) return invalid("padding_tokens is ", padding, " (expected >= 0)");
  // Every step trains at least one real token (a row holds a document), and
  // no step computes more slots than this job's batch has.
  if (tokens < step) {
    return invalid("tokens is ", tokens, " after ", step, " steps (expected at least one a step)");
  }
  const int64_t micro_tokens = int64_t{c_.data.seq_len} * c_.micro_batch_rows;
  const int64_t slots_per_step =
      c_.global_batch_tokens > 0 ? c_.global_batch_tokens : micro_tokens;
  if (tokens > step * slots_per_step || padding > step * slots_per_step - tokens) {
    return invalid("tokens (", tokens, ") and padding_tokens (", padding,
                   ") are more than ", step, " steps of this job's batch (", slots_per_step,
                   " token slots a step) hold");
  }
  // Every finished epoch trained every token of the training set once.
  const int64_t train_tokens = std::max<int64_t>(1, train_->num_tokens());
  if (epoch < 0 || epoch > tokens / train_tokens) {
    return mismatch("cursor_epoch is ", epoch, " (expected between 0 and ",
                    tokens / train_tokens, ": ", tokens, " tokens trained over a training set of ",
                    train_tokens, " tokens in ", train_->prefix(), ")");
  }
  rows_->Seek({epoch, 0});
  const int64_t epoch_rows = rows_->epoch_stats().rows;
  if (row < 0 || row > epoch_rows) {
    return mismatch("cursor_row is ", row, " (expected between 0 and ", epoch_rows,
                    ", the rows of epoch ", epoch, " of ", train_->prefix(), ")");
  }
  if (const auto ev = meta.find("evaluated"); ev != meta.end() && !ev->is_boolean()) {
    return invalid("metadata field evaluated is ", ev->dump().substr(0, 40),
                   " (expected true or false)");
  }

  // Tensors: what this model holds, whole (sharded experts included).
  struct Want {
    std::vector<int64_t> shape;
    at::ScalarType dtype;
    bool non_negative;  // AdamW's second moment
  };
  std::map<std::string, Want> want;
  const auto& params = model_->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    std::vector<int64_t> shape = params[i].value.sizes().vec();
    if (params[i].sharded && !shape.empty()) shape[0] *= c_.parallel.world_size;
    const at::ScalarType dtype = params[i].value.scalar_type();
    want["model." + params[i].name] = {shape, dtype, false};
    want["adamw.m." + params[i].name] = {shape, opt_->m()[i].scalar_type(), false};
    want["adamw.v." + params[i].name] = {shape, opt_->v()[i].scalar_type(), true};
  }
  for (const auto& [layer, bias] : model_->expert_biases()) {
    want[absl::StrCat("moe.layers.", layer, ".bias")] = {bias.sizes().vec(), bias.scalar_type(),
                                                          false};
  }
  auto shape_str = [](absl::Span<const int64_t> s) { return absl::StrCat("[", absl::StrJoin(s, ", "), "]"); };
  for (const auto& [name, w] : want) {
    const auto it = tensors.find(name);
    if (it == tensors.end()) return invalid("tensor ", name, " is missing");
    const at::Tensor& t = it->second;
    if (t.scalar_type() != w.dtype) {
      return invalid("tensor ", name, " is ", c10::toString(t.scalar_type()), " (expected ",
                     c10::toString(w.dtype), ")");
    }
    if (!t.sizes().equals(w.shape)) {
      return invalid("tensor ", name, " has shape ", shape_str(t.sizes()), " (expected ",
                     shape_str(w.shape), ", this model's)");
    }
    if (!AllFinite(t)) return invalid("tensor ", name, " holds NaN or Inf");
    if (w.non_negative && t.numel() > 0 && t.min().item<double>() < 0) {
      return invalid("tensor ", name, " holds negative values (a second moment is >= 0)");
    }
  }
  // Anything else is FP8 scaling state (precision/converter.h), checked by
  // the converter against this model's layers and recipe.
  std::map<std::string, at::Tensor> fp8_state;
  for (const auto& [name, t] : tensors) {
    if (want.count(name)) continue;
    if (!fp8_ || name.rfind("fp8.", 0) != 0) {
      return invalid("tensor ", name, " is not part of this model");
    }
    fp8_state.emplace(name, t);
  }
  if (fp8_) RETURN_IF_ERROR(fp8_->CheckState(fp8_state, model_->LinearSites(), step));
  return absl::OkStatus();
}

absl::Status Run::LoadCheckpoint() {
  auto data = ReadCheckpoint(c_.resume_path, c_.resume_sha256);
  if (!data.ok()) return data.status();
  auto in_file = [&](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat("checkpoint ", c_.resume_path, ": ", s.message()));
  };
  // Ours are a few hundred bytes; this bounds what a hostile one can make
  // the parser allocate.
  constexpr size_t kMaxMetadataBytes = 1 << 16;
  if (data->metadata_json.size() > kMaxMetadataBytes) {
    return in_file(absl::InvalidArgumentError(absl::StrCat(
        "metadata is ", data->metadata_json.size(), " bytes (at most ", kMaxMetadataBytes,
        " expected)")));
  }
  const nlohmann::json meta = nlohmann::json::parse(data->metadata_json, nullptr, false);
  if (meta.is_discarded()) {
    return in_file(absl::InvalidArgumentError("metadata is not valid JSON"));
  }
  std::map<std::string, at::Tensor> by_name(data->tensors.begin(), data->tensors.end());
  if (absl::Status s = CheckCheckpoint(meta, by_name); !s.ok()) return in_file(s);
  // Where the run's weights first came from stays recorded.
  if (auto it = meta.find("init_from"); it != meta.end() && it->is_object()) {
    init_from_json_ = *it;
  }

  auto& params = model_->parameters();
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    for (auto [prefix, dst] : {std::pair{"model.", params[i].value},
                               std::pair{"adamw.m.", opt_->m()[i]},
                               std::pair{"adamw.v.", opt_->v()[i]}}) {
      at::Tensor src = by_name.at(prefix + params[i].name);
      if (params[i].sharded) {
        src = src.narrow(0, c_.parallel.rank * dst.size(0), dst.size(0));  // this rank's experts
      }
      dst.copy_(src);
    }
  }
  for (auto& [layer, bias] : model_->expert_biases()) {
    bias.copy_(by_name.at(absl::StrCat("moe.layers.", layer, ".bias")));
  }
  if (fp8_) {
    std::string bad;
    if (!fp8_->LoadState(by_name, &bad)) {
      return in_file(absl::InvalidArgumentError("FP8 scaling state " + bad + " is unreadable"));
    }
  }
  state_ = ResumedState(meta);
  opt_->set_step(meta["optimizer_step"].get<int64_t>());
  rows_->Seek(ResumedCursor(meta));
  return absl::OkStatus();
}

}  // namespace tally::train::internal
