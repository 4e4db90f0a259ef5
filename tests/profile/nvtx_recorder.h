// A static NVTX injection for tests (NVTX load sequence v2, nvtxDetail/nvtxInit.h): records the
// domains, registered strings, named categories and push/pop ranges this process emits, as a
// tool like nsys would see them. Include in exactly one translation unit of a test executable,
// compiled with ULYSSES_HAS_NVTX and the NVTX3 include path.
#pragma once
#include <cstdint>

// This TU defines the strong InitializeInjectionNvtx2_fnptr (at the end), so the NVTX headers
// must neither define their weak one here nor use it undeclared.
extern "C" {
extern int (*InitializeInjectionNvtx2_fnptr)(const void* (*get_export_table)(uint32_t));
}
#define NVTX_STATIC_INJECTION_IMPL 1
#include <nvtx3/nvToolsExt.h>

#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace ulysses::testing {

struct RecordedPush {
  std::string domain;
  std::string message;  // the registered string's text ("<unregistered>" otherwise)
  bool registered = false;
  uint32_t category = 0;
  bool has_int64_payload = false;
  int64_t payload = 0;
};

struct NvtxRecord {
  std::mutex mutex;
  std::vector<std::string> domains;         // created, in order
  std::vector<std::string> strings;         // registered, in order (handle = index + 1)
  std::vector<std::string> string_domains;  // the domain of each registered string
  std::map<std::pair<std::string, uint32_t>, std::string> categories;  // (domain, id) -> name
  std::vector<RecordedPush> pushes;
  std::map<std::string, int64_t> pops;  // per domain
  bool initialized = false;
};

inline NvtxRecord& nvtx_record() {
  static NvtxRecord* record = new NvtxRecord;
  return *record;
}

namespace nvtx_injection {

inline std::string domain_name(nvtxDomainHandle_t domain) {
  const auto index = reinterpret_cast<uintptr_t>(domain);
  const auto& domains = nvtx_record().domains;
  return index >= 1 && index <= domains.size() ? domains[index - 1] : "<global>";
}

inline nvtxDomainHandle_t NVTX_API domain_create(const char* name) {
  std::lock_guard<std::mutex> lock(nvtx_record().mutex);
  nvtx_record().domains.push_back(name);
  return reinterpret_cast<nvtxDomainHandle_t>(nvtx_record().domains.size());
}

inline nvtxStringHandle_t NVTX_API register_string(nvtxDomainHandle_t domain, const char* text) {
  std::lock_guard<std::mutex> lock(nvtx_record().mutex);
  nvtx_record().strings.push_back(text);
  nvtx_record().string_domains.push_back(domain_name(domain));
  return reinterpret_cast<nvtxStringHandle_t>(nvtx_record().strings.size());
}

inline void NVTX_API name_category(nvtxDomainHandle_t domain, uint32_t id, const char* name) {
  std::lock_guard<std::mutex> lock(nvtx_record().mutex);
  nvtx_record().categories[{domain_name(domain), id}] = name;
}

inline int NVTX_API range_push(nvtxDomainHandle_t domain, const nvtxEventAttributes_t* attr) {
  std::lock_guard<std::mutex> lock(nvtx_record().mutex);
  RecordedPush push;
  push.domain = domain_name(domain);
  push.category = attr->category;
  if (attr->messageType == NVTX_MESSAGE_TYPE_REGISTERED) {
    const auto index = reinterpret_cast<uintptr_t>(attr->message.registered);
    push.registered = true;
    push.message = index >= 1 && index <= nvtx_record().strings.size()
                       ? nvtx_record().strings[index - 1]
                       : "<bad handle>";
  } else {
    push.message = "<unregistered>";
  }
  if (attr->payloadType == NVTX_PAYLOAD_TYPE_INT64) {
    push.has_int64_payload = true;
    push.payload = attr->payload.llValue;
  }
  nvtx_record().pushes.push_back(push);
  return 0;
}

inline int NVTX_API range_pop(nvtxDomainHandle_t domain) {
  std::lock_guard<std::mutex> lock(nvtx_record().mutex);
  ++nvtx_record().pops[domain_name(domain)];
  return 0;
}

inline int NVTX_API initialize(NvtxGetExportTableFunc_t get_export_table) {
  const auto* callbacks =
      static_cast<const NvtxExportTableCallbacks*>(get_export_table(NVTX_ETID_CALLBACKS));
  NvtxFunctionTable table = nullptr;
  unsigned int size = 0;
  if (callbacks == nullptr ||
      !callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &table, &size)) {
    return 0;
  }
  *table[NVTX_CBID_CORE2_DomainCreateA] = reinterpret_cast<NvtxFunctionPointer>(&domain_create);
  *table[NVTX_CBID_CORE2_DomainRegisterStringA] =
      reinterpret_cast<NvtxFunctionPointer>(&register_string);
  *table[NVTX_CBID_CORE2_DomainNameCategoryA] =
      reinterpret_cast<NvtxFunctionPointer>(&name_category);
  *table[NVTX_CBID_CORE2_DomainRangePushEx] = reinterpret_cast<NvtxFunctionPointer>(&range_push);
  *table[NVTX_CBID_CORE2_DomainRangePop] = reinterpret_cast<NvtxFunctionPointer>(&range_pop);
  nvtx_record().initialized = true;
  return 1;
}

}  // namespace nvtx_injection

// Pushes of `domain` whose message is `message`.
inline std::vector<RecordedPush> pushes_named(const std::string& domain,
                                              const std::string& message) {
  std::lock_guard<std::mutex> lock(nvtx_record().mutex);
  std::vector<RecordedPush> out;
  for (const auto& p : nvtx_record().pushes)
    if (p.domain == domain && p.message == message) out.push_back(p);
  return out;
}

}  // namespace ulysses::testing

extern "C" {
NvtxInitializeInjectionNvtxFunc_t InitializeInjectionNvtx2_fnptr =
    &ulysses::testing::nvtx_injection::initialize;
}
