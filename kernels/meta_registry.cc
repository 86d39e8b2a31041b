// The conditional registration of metaload's Meta kernels, and the helpers every kernel file
// shares (meta_common.h).
//
// Why runtime registration: TORCH_LIBRARY_IMPL(aten, Meta, m) would register every kernel
// unconditionally, replacing (with a warning) the kernels of a newer libtorch that has its own. So
// each op is looked up in the dispatcher when the library loads and gets a kernel only where none
// is registered, through torch::Library objects created at run time and kept in a static registry.
//
// Why Python kernels are overridden: `import torch` (1.13) registers Python Meta kernels
// (torch/_meta_registrations.py, torch/_decomp) for ~115 ops before this library can load. Each
// call into one costs a trip through the interpreter (tens of microseconds), which defeats a C++
// scan, and some disagree with the CPU kernel (1.13's native_batch_norm in eval returns save_mean
// of shape (C,) where CPU returns (0,)). A Python kernel is recognised from the dispatcher's own
// record of it: Python registrations carry the file "/dev/null" (1.13) or a ".py" file (2.x) in
// their debug string and have a boxed kernel only. Everything else counts as C++ and is never
// overridden. The dispatcher keeps overridden kernels underneath ours, so unloading ours brings
// the Python one back.
#include "kernels/meta_registry.h"

#include <ATen/ExpandUtils.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>

#include "base/registration.h"
#include "base/torch_compat.h"
#include "base/torch_library.h"
#include "kernels/meta_common.h"

namespace metaload {

// ---- the registry ---------------------------------------------------------------------------

namespace {

// Swallows warnings while ours go over Python kernels: the dispatcher warns "Overriding a
// previously registered kernel" for each, which is exactly what we mean to do.
class SilentWarnings : public compat::WarningMessageHandler {
 public:
  void on_warning(const std::string&) override {}
};

struct Registry {
  std::mutex mu;
  // Libraries hold the registrations; one per namespace per ensure_meta_kernels() round that
  // registered something. Never destroyed before exit.
  std::vector<std::unique_ptr<torch::Library>> libraries;
  std::set<std::string> registered;
  std::set<std::string> replaced_python;
  MetaKernelReport last;  // kept_native / composite / absent / failed of the latest round
};

Registry& registry() {
  static Registry r;
  return r;
}

std::vector<meta::KernelDef> full_table() {
  std::vector<meta::KernelDef> all;
  for (const auto* part :
       {&meta::conv_norm_kernels(), &meta::pool_kernels(), &meta::pointwise_index_kernels(),
        &meta::linalg_kernels(), &meta::reduction_kernels()}) {
    all.insert(all.end(), part->begin(), part->end());
  }
  return all;
}

// "relu" -> ("aten", "aten::relu", ""), "where.self" -> ("aten", "aten::where", "self"),
// "ns::op.o" -> ("ns", "ns::op", "o").
struct SplitName {
  std::string ns, full, name, overload;
};

SplitName split_op(const std::string& op) {
  SplitName s;
  std::string rest = op;
  auto colons = op.find("::");
  if (colons == std::string::npos) {
    s.ns = "aten";
  } else {
    s.ns = op.substr(0, colons);
    rest = op.substr(colons + 2);
  }
  auto dot = rest.find('.');
  s.name = s.ns + "::" + rest.substr(0, dot);
  s.overload = dot == std::string::npos ? "" : rest.substr(dot + 1);
  s.full = s.ns + "::" + rest;
  return s;
}

c10::optional<c10::OperatorHandle> find(const SplitName& s) {
  return c10::Dispatcher::singleton().findOp(c10::OperatorName(s.name, s.overload));
}

MetaKernelOwner owner_of(const c10::OperatorHandle& op) {
  if (!op.hasKernelForDispatchKey(c10::DispatchKey::Meta)) return MetaKernelOwner::kNone;
  return classify_meta_kernel(op.dumpState());
}

}  // namespace

const char* to_string(MetaKernelOwner owner) {
  switch (owner) {
    case MetaKernelOwner::kNone:
      return "none";
    case MetaKernelOwner::kMetaload:
      return "metaload";
    case MetaKernelOwner::kPython:
      return "python";
    case MetaKernelOwner::kNative:
      return "native";
  }
  return "?";
}

MetaKernelOwner classify_meta_kernel(const std::string& dump) {
  // The line reads "Meta: <debug> :: <inferred schema or (none)> [ <flags> ]"; the debug is
  // "registered at <file>:<line>" unless the registration gave its own.
  std::istringstream lines(dump);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("Meta: ", 0) != 0) continue;
    std::string rest = line.substr(6);
    auto sep = rest.find(" :: ");
    std::string debug = rest.substr(0, sep);
    std::string flags;
    if (auto open = rest.rfind('['); open != std::string::npos) flags = rest.substr(open);
    if (debug == meta::kKernelDebug) return MetaKernelOwner::kMetaload;
    const std::string at = "registered at ";
    if (debug.rfind(at, 0) == 0) {
      std::string where = debug.substr(at.size());
      std::string file = where.substr(0, where.rfind(':'));
      bool python_file =
          file == "/dev/null" || (file.size() >= 3 && file.compare(file.size() - 3, 3, ".py") == 0);
      bool boxed_only = flags.find("unboxed") == std::string::npos;
      if (python_file && boxed_only) return MetaKernelOwner::kPython;
    }
    return MetaKernelOwner::kNative;
  }
  return MetaKernelOwner::kNone;
}

MetaKernelOwner meta_kernel_owner(const std::string& op) {
  auto s = split_op(op);
  auto handle = find(s);
  if (!handle) throw UnknownOpError("no operator " + s.full + " in this libtorch");
  return owner_of(*handle);
}

namespace {

// Registers the kernels of `defs` that are missing. Caller holds the registry lock.
std::vector<std::string> register_missing(const std::vector<meta::KernelDef>& defs,
                                          MetaKernelReport& round) {
  auto& reg = registry();
  std::vector<std::string> added;
  std::map<std::string, torch::Library*> libs;  // this round's library per namespace
  for (const auto& def : defs) {
    auto s = split_op(def.op);
    auto handle = find(s);
    if (!handle) {
      round.absent.push_back(s.full);
      continue;
    }
    if (handle->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd)) {
      round.composite.push_back(s.full);
      continue;
    }
    MetaKernelOwner owner = owner_of(*handle);
    if (owner == MetaKernelOwner::kMetaload) continue;
    if (owner == MetaKernelOwner::kNative) {
      round.kept_native.push_back(s.full);
      continue;
    }
    try {
      auto*& lib = libs[s.ns];
      if (lib == nullptr) {
        reg.libraries.push_back(std::make_unique<torch::Library>(
            torch::Library::IMPL, s.ns, c10::DispatchKey::Meta, __FILE__, __LINE__));
        lib = reg.libraries.back().get();
      }
      SilentWarnings silent;
      compat::WarningHandlerGuard guard(&silent);
      def.add(*lib);
    } catch (const std::exception& e) {
      std::string why = e.what();
      round.failed.emplace_back(s.full, why.substr(0, why.find("\nException raised from")));
      continue;
    }
    reg.registered.insert(s.full);
    if (owner == MetaKernelOwner::kPython) reg.replaced_python.insert(s.full);
    added.push_back(s.full);
  }
  return added;
}

}  // namespace

std::vector<std::string> meta::ensure_kernels(const std::vector<KernelDef>& defs,
                                              MetaKernelReport* round) {
  auto& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  MetaKernelReport scratch;
  MetaKernelReport& r = round != nullptr ? *round : scratch;
  try {
    return register_missing(defs, r);
  } catch (const std::exception& e) {
    r.failed.emplace_back("*", e.what());
    return {};
  }
}

std::vector<std::string> ensure_meta_kernels() {
  MetaKernelReport round;
  auto added = meta::ensure_kernels(full_table(), &round);
  auto& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  reg.last = std::move(round);
  return added;
}

std::vector<std::string> registered_meta_kernels() {
  auto& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  return {reg.registered.begin(), reg.registered.end()};
}

MetaKernelReport meta_kernel_report() {
  auto& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  MetaKernelReport r = reg.last;
  r.registered.assign(reg.registered.begin(), reg.registered.end());
  r.replaced_python.assign(reg.replaced_python.begin(), reg.replaced_python.end());
  return r;
}

std::vector<std::string> meta_kernel_table() {
  std::vector<std::string> names;
  for (const auto& def : full_table()) names.push_back(split_op(def.op).full);
  return names;
}

namespace {

// Load-time registration, deferred by register_when_safe when the library is preloaded into a
// Python interpreter that has not imported torch yet (torch's Python kernels would otherwise land
// on top of ours). METALOAD_META_KERNELS=off (or 0) leaves the dispatcher untouched, e.g. to
// measure Python's meta kernels against ours.
[[maybe_unused]] const bool registered_at_load = [] {
  const char* env = std::getenv("METALOAD_META_KERNELS");
  if (env != nullptr && (std::string(env) == "off" || std::string(env) == "0")) return false;
  register_when_safe([] { ensure_meta_kernels(); });
  return true;
}();

std::string owner_op(const std::string& op) {
  return to_string(meta_kernel_owner(op));
}

}  // namespace

// Python: torch.ops.metaload.registered_meta_kernels() etc.
METALOAD_LIBRARY_FRAGMENT(m) {
  m.def("registered_meta_kernels() -> str[]", [] { return registered_meta_kernels(); });
  m.def("ensure_meta_kernels() -> str[]", [] { return ensure_meta_kernels(); });
  m.def("meta_kernel_owner(str op) -> str", &owner_op);
  m.def("meta_kernel_table() -> str[]", [] { return meta_kernel_table(); });
  m.def("replaced_python_meta_kernels() -> str[]",
        [] { return meta_kernel_report().replaced_python; });
}

// ---- helpers shared by the kernel files (meta_common.h) ---------------------------------------

namespace meta {

int64_t wrap_dim(const char* op, int64_t dim, int64_t ndim) {
  int64_t n = std::max<int64_t>(ndim, 1);  // a 0-dim tensor takes dims 0 and -1
  META_CHECK(dim >= -n && dim < n, op, "Dimension out of range (expected to be in range of [", -n,
             ", ", n - 1, "], but got ", dim, ")");
  return dim < 0 ? dim + n : dim;
}

c10::SmallVector<int64_t, 4> expand_param(const char* op, const char* what, IntArrayRef list,
                                          int64_t n, bool allow_single) {
  if (allow_single && list.size() == 1) return c10::SmallVector<int64_t, 4>(n, list[0]);
  META_CHECK(static_cast<int64_t>(list.size()) == n, op, "expected ", what, " to be ",
             allow_single ? "a single integer value or " : "", "a list of ", n, " values, but got ",
             what, "=", list);
  return c10::SmallVector<int64_t, 4>(list.begin(), list.end());
}

Tensor new_meta(IntArrayRef sizes, ScalarType dtype, MemoryFormat format) {
  return new_meta(sizes, format_strides(sizes, format), dtype);
}

c10::SmallVector<int64_t, 5> contiguous_strides(IntArrayRef sizes) {
  c10::SmallVector<int64_t, 5> strides(sizes.size());
  int64_t s = 1;
  for (int64_t i = static_cast<int64_t>(sizes.size()) - 1; i >= 0; --i) {
    strides[i] = s;
    s *= std::max<int64_t>(sizes[i], 1);
  }
  return strides;
}

c10::SmallVector<int64_t, 5> format_strides(IntArrayRef sizes, MemoryFormat format) {
  switch (format) {
    case MemoryFormat::ChannelsLast: {
      auto v = c10::get_channels_last_strides_2d(sizes);
      return c10::SmallVector<int64_t, 5>(v.begin(), v.end());
    }
    case MemoryFormat::ChannelsLast3d: {
      auto v = c10::get_channels_last_strides_3d(sizes);
      return c10::SmallVector<int64_t, 5>(v.begin(), v.end());
    }
    default:
      return contiguous_strides(sizes);
  }
}

MemoryFormat suggest_format(IntArrayRef sizes, IntArrayRef strides) {
  // TensorImpl::is_strides_like_channels_last{,_3d} compute exactly these.
  if (c10::is_channels_last_strides_2d(sizes, strides)) return MemoryFormat::ChannelsLast;
  if (c10::is_channels_last_strides_3d(sizes, strides)) return MemoryFormat::ChannelsLast3d;
  return MemoryFormat::Contiguous;
}

Tensor new_meta_like(const Tensor& t, ScalarType dtype, MemoryFormat format) {
  if (format != MemoryFormat::Preserve) return new_meta(t.sizes(), dtype, format);
  if (t.is_non_overlapping_and_dense()) return new_meta(t.sizes(), t.strides(), dtype);
  return new_meta(t.sizes(), at::infer_dense_strides(t.sizes(), t.strides()), dtype);
}

Tensor converted_like(const Tensor& t, ScalarType dtype) {
  if (t.is_non_overlapping_and_dense()) return new_meta(t.sizes(), t.strides(), dtype);
  return new_meta(t.sizes(), dtype, t.suggest_memory_format());
}

Tensor view_of(const Tensor& base, IntArrayRef sizes, IntArrayRef strides, int64_t offset) {
  auto impl = c10::make_intrusive<c10::TensorImpl>(
      c10::TensorImpl::VIEW, c10::Storage(base.storage()), base.key_set(), base.dtype());
  impl->set_sizes_and_strides(sizes, strides);
  impl->set_storage_offset(offset);
  return Tensor(std::move(impl));
}

bool resize_out(const Tensor& out, IntArrayRef sizes, IntArrayRef strides, bool warn) {
  if (out.sizes() == sizes) return false;
  if (warn && out.numel() != 0) {
    TORCH_WARN("An output with one or more elements was resized since it had shape ", out.sizes(),
               ", which does not match the required output shape ", sizes,
               ". This behavior is deprecated, and in a future PyTorch release outputs will not "
               "be resized unless they have zero elements. You can explicitly reuse an out "
               "tensor t by resizing it, inplace, to zero elements with t.resize_(0).");
  }
  auto* impl = out.unsafeGetTensorImpl();
  if (strides.empty()) {
    impl->set_sizes_contiguous(sizes);
  } else {
    impl->set_sizes_and_strides(sizes, strides);
  }
  // Meta storage has no bytes, only a size: grow it so the new extent is in bounds.
  if (impl->has_storage()) {
    size_t needed = at::detail::computeStorageNbytes(out.sizes(), out.strides(),
                                                     out.dtype().itemsize(), out.storage_offset());
    auto* storage = impl->storage().unsafeGetStorageImpl();
    if (storage->nbytes() < needed) storage->set_nbytes(needed);
  }
  return true;
}

}  // namespace meta
}  // namespace metaload
